"""`slimrl dpo | orpo | kto`: the conventions of cli/args.py (TrlParser flags, --config, slimrl's fields, the CLI
defaults marked in --help) over DPOConfig / ORPOConfig (TRL's experimental one) / KTOConfig, and a preference
dataset's columns."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimrl.cli.args import SHORT_RUN_DEFAULTS, DataArguments, ModelArguments, SlimrlArguments, command_parser
from slimrl.cli.parsing import parsed_arguments, run_name
from slimrl.swaps import set_field

from ..families import CLI_PREFERENCE

PREFERENCE_ALGORITHMS = CLI_PREFERENCE

# Shared CLI defaults for the preference trainers (TRL's defaults target GPUs and long runs). Measured basis: the
# README's preference section (embedded SmolLM2-135M, built-in arithmetic preference pairs, 2-core CPU).
PREFERENCE_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    **SHORT_RUN_DEFAULTS,
    "output_dir": ("outputs/slimrl-{algorithm}-{task}", "{algorithm} and {task} are replaced"),
    "learning_rate": (
        5e-5,
        "LoRA on a 135M model needs a larger step than full fine-tuning's 1e-6 to move in 30 steps",
    ),
    "max_steps": (30, "a few minutes on a 2-core CPU"),
    "per_device_train_batch_size": (4, "4 pairs (KTO: 4 rows) per step keep a CPU step to seconds"),
    "max_length": (256, "prompt + answer of the arithmetic set fit in ~150 tokens; TRL's 1024 only pads"),
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
    config = preference_config_class(algorithm)
    summary = (
        f"Train a model with {algorithm.upper()} (TRL's {config.__name__.removesuffix('Config')}Trainer on slimrl's "
        "memory paths)."
    )
    arguments = (PreferenceTaskArguments, ModelArguments, SlimrlArguments, config)
    return command_parser(arguments, f"slimrl {algorithm}", summary, PREFERENCE_CLI_DEFAULTS)


def parse_preference_args(algorithm: str, argv: list[str]):
    """(task_args, model_args, training_args) for `slimrl dpo|orpo|kto`."""
    task_args, model_args, training_args = parsed_arguments(build_preference_parser(algorithm), argv)
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
    output_dir = str(training_args.output_dir).replace("{algorithm}", algorithm)
    set_field(
        training_args, "output_dir", output_dir.replace("{task}", run_name(task_args)), "{algorithm}, {task} filled"
    )
    from slimrl.cli.run_control import apply_run_flags

    apply_run_flags(algorithm, list(argv), task_args, training_args)
    return task_args, model_args, training_args
