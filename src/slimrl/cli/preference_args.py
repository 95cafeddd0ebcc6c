"""`slimrl dpo | orpo | kto`: the conventions of cli/args.py (TrlParser flags, --config, slimrl's fields, the CLI
defaults marked in --help) over DPOConfig / ORPOConfig (TRL's experimental one) / KTOConfig, and a preference
dataset's columns."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimrl.cli.args import (
    DataArguments,
    ModelArguments,
    SlimrlArguments,
    apply_slimrl_arguments,
    follow_model_checkpointing,
    mark_user_fields,
    parse_with_config,
    resolve_eval_samples,
    set_cli_defaults,
)

PREFERENCE_ALGORITHMS = ("dpo", "orpo", "kto")

# Shared CLI defaults for the preference trainers (TRL's defaults target GPUs and long runs). Measured basis: the
# README's preference section (embedded SmolLM2-135M, built-in arithmetic preference pairs, 2-core CPU).
PREFERENCE_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    "output_dir": ("outputs/slimrl-{algorithm}-{task}", "{algorithm} and {task} are replaced"),
    "learning_rate": (
        5e-5,
        "LoRA on a 135M model needs a larger step than full fine-tuning's 1e-6 to move in 30 steps",
    ),
    "lr_scheduler_type": ("constant", "a linear decay over 30 steps would halve the average step"),
    "max_steps": (30, "a few minutes on a 2-core CPU"),
    "per_device_train_batch_size": (4, "4 pairs (KTO: 4 rows) per step keep a CPU step to seconds"),
    "max_length": (256, "prompt + answer of the arithmetic set fit in ~150 tokens; TRL's 1024 only pads"),
    "logging_steps": (1, "one metrics row (and progress-bar update) per step"),
    "gradient_checkpointing": (False, "a 135M model's activations are small; recomputation only costs time on CPU"),
    "save_strategy": ("no", "the LoRA adapter is saved once at the end"),
}


@dataclass
class PreferenceTaskArguments(DataArguments):
    """`slimrl dpo | orpo | kto`: the columns of a preference dataset."""

    chosen_column: str = field(default="chosen", metadata={"help": "dpo/orpo: column holding the preferred answer."})
    rejected_column: str = field(default="rejected", metadata={"help": "dpo/orpo: column holding the rejected answer."})
    completion_column: str = field(default="completion", metadata={"help": "kto: column holding the answer."})
    label_column: str = field(
        default="label", metadata={"help": "kto: column holding the desirable (true) / undesirable (false) label."}
    )


def preference_config_class(algorithm: str):
    if algorithm == "dpo":
        from trl import DPOConfig as config
    elif algorithm == "kto":
        from trl import KTOConfig as config
    elif algorithm == "orpo":
        from trl.experimental.orpo import ORPOConfig as config
    else:
        raise ValueError(f"unknown preference algorithm {algorithm!r}; known: {', '.join(PREFERENCE_ALGORITHMS)}")
    return config


def build_preference_parser(algorithm: str):
    from trl import TrlParser

    config = preference_config_class(algorithm)
    parser = TrlParser(
        (PreferenceTaskArguments, ModelArguments, SlimrlArguments, config),
        prog=f"slimrl {algorithm}",
        description=f"Train a model with {algorithm.upper()} (TRL's "
        f"{config.__name__.removesuffix('Config')}Trainer on slimrl's memory paths). "
        f"Every {config.__name__} field is a flag; "
        "--config run.yaml sets defaults, flags override it.",
    )
    set_cli_defaults(parser, PREFERENCE_CLI_DEFAULTS)
    return parser


def parse_preference_args(algorithm: str, argv: list[str]):
    """(task_args, model_args, training_args) for `slimrl dpo|orpo|kto`."""
    task_args, model_args, slimrl_args, training_args = parse_with_config(build_preference_parser(algorithm), argv)
    apply_slimrl_arguments(training_args, slimrl_args)
    resolve_eval_samples(task_args, training_args.max_steps)
    mark_user_fields(training_args, list(argv))
    follow_model_checkpointing(model_args, training_args)
    if model_args.dtype == "auto":
        model_args.dtype = None
    if model_args.fast_inference:
        raise ValueError(
            f"--fast_inference: `slimrl {algorithm}` trains on a fixed dataset and generates nothing; "
            "it applies to `slimrl grpo` and `slimrl ppo` only."
        )
    if task_args.dataset_name and any(
        getattr(task_args, k) is not None for k in ("max_operand", "operations", "num_examples")
    ):
        raise ValueError(
            "--max_operand/--operations/--num_examples shape the built-in arithmetic set; they do not "
            "apply with --dataset_name"
        )
    name = task_args.task
    if task_args.dataset_name:
        name = task_args.dataset_name.rstrip("/").replace("\\", "/").split("/")[-1].split(".")[0] or "dataset"
    training_args.output_dir = str(training_args.output_dir).replace("{algorithm}", algorithm).replace("{task}", name)
    from slimrl.cli.run_control import apply_run_flags

    apply_run_flags(algorithm, list(argv), task_args, training_args)
    return task_args, model_args, training_args
