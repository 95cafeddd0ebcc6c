"""`slimrl online-dpo`: task → model + LoRA → eval before → OnlineDPOTrainer.train → adapter, metrics, plot → eval
after.

Choices made:
- The same conventions and outputs as `slimrl grpo` (its task, model, evaluation and output helpers are reused): every
  OnlineDPOConfig field (TRL's experimental trainer) is a flag through TRL's TrlParser, `--config run.yaml` works,
  the model/LoRA/task flags and slimrl's own (`--slimrl_num_chunks`, `--slimrl_reward_errors`) are grpo's, errors
  print as one line, and output_dir receives the adapter, `metrics.jsonl`, `training_curves.png`, `eval.json` and
  `slimrl_run.json`. Cheap checks (task, rewards, judge) run before the model loads.
- Each step samples two completions per prompt; the better one by reward is chosen, the other rejected. The reward:
  the built-in arithmetic task's reward functions (format, correctness, closeness), or with `--dataset_name` the sum
  of `--reward_funcs`; or a pairwise judge (`--judge arithmetic`, the built-in one preferring the right answer, or
  `module.Class` / `file.py:Class`), turned into the reward TRL 1.16 takes by slimrl.patches.judges.
- The reference is the adapter-disabled base (TRL's own behaviour with LoRA).
- CLI defaults differ from TRL's where a 2-core CPU needs it (`ONLINE_DPO_CLI_DEFAULTS`, marked in --help).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from slimrl.cli.args import TaskArguments

DEFAULT_OUTPUT_DIR = "outputs/slimrl-online-dpo-{task}"
BAR_KEYS = {"score": "objective/scores", "margin": "rewards/margins", "kl": "objective/kl"}

# OnlineDPOConfig field -> (CLI default, why). Basis: the bare command's run on the embedded SmolLM2-135M.
ONLINE_DPO_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (5e-5, "LoRA needs a far larger step than full fine-tuning's 5e-7 to move in 30 steps"),
    "lr_scheduler_type": ("constant", "a linear decay over 30 steps would halve the average step"),
    "max_steps": (30, "a few minutes on a 2-core CPU"),
    "per_device_train_batch_size": (4, "4 prompts x 2 completions per step"),
    "max_new_tokens": (16, "an answer `<answer>18</answer>` is 8 tokens; TRL's 64 only costs generation time"),
    "max_length": (256, "prompt + answer of the arithmetic task fit in ~150 tokens"),
    "logging_steps": (1, "one metrics row (and progress-bar update) per step"),
    "gradient_checkpointing": (False, "a 135M model's activations are small; recomputation only costs time on CPU"),
    "save_strategy": ("no", "the LoRA adapter is saved once at the end"),
}


@dataclass
class OnlineDPOTaskArguments(TaskArguments):
    judge: str | None = field(
        default=None,
        metadata={
            "help": "Rank each prompt's two completions with a pairwise judge instead of reward functions: "
            "'arithmetic' (built-in: the right answer, then a well-formed one) or a class, module.Class or "
            "path/to/file.py:Class, with a judge(prompts, completions) method."
        },
    )


def build_parser():
    from trl import TrlParser
    from trl.experimental.online_dpo import OnlineDPOConfig

    from slimrl.cli.args import ModelArguments, OnlineSlimrlArguments, set_cli_defaults

    parser = TrlParser(
        (OnlineDPOTaskArguments, ModelArguments, OnlineSlimrlArguments, OnlineDPOConfig),
        prog="slimrl online-dpo",
        description="Train a model with online DPO (TRL's experimental OnlineDPOTrainer on slimrl's memory paths): "
        "two completions per prompt, the better by reward or judge chosen. Every OnlineDPOConfig field is a flag; "
        "--config run.yaml sets defaults, flags override it.",
    )
    set_cli_defaults(parser, ONLINE_DPO_CLI_DEFAULTS)
    return parser


def parse_args(argv: list[str]):
    """(task_args, model_args, training_args) for `slimrl online-dpo` (grpo's conventions: cli/args.py)."""
    from slimrl.cli.args import parse_online_args

    task_args, model_args, training_args = parse_online_args(build_parser(), argv)
    if model_args.fast_inference:
        raise ValueError(
            "--fast_inference: `slimrl online-dpo` generates with transformers (or OnlineDPOConfig's own --use_vllm); "
            "the attached engine serves `slimrl grpo` and `slimrl ppo` only."
        )
    if task_args.judge and task_args.reward_funcs:
        raise ValueError("--judge and --reward_funcs both given: a pair is ranked by one of them; pass one.")
    return task_args, model_args, training_args


def apply_patches() -> None:
    from slimrl.models.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL("online_dpo", FastLanguageModel)


def online_dpo_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    return [
        ("score", ["objective/scores", "objective/scores_margin"]),
        ("implicit reward margin / accuracy", ["rewards/margins", "rewards/accuracies"]),
        ("KL", ["objective/kl"]),
    ]


def build_online_task(task_args, seed: int):
    """grpo's task; a dataset ranked by a judge needs no reward function."""
    from slimrl.cli.grpo import build_task
    from slimrl.tasks.custom import dataset_task

    if not (task_args.judge and task_args.dataset_name):
        return build_task(task_args, seed)
    return dataset_task(
        task_args.dataset_name,
        [],
        task_args.dataset_config,
        task_args.prompt_column,
        task_args.dataset_train_split,
        task_args.dataset_test_split,
        task_args.num_train_samples,
        task_args.num_eval_samples,
        seed,
        task_args.accuracy_reward,
        require_rewards=False,
    )


def ranking(task, task_args) -> tuple[list, str]:
    """(reward functions, description): the judge's reward, or the task's / dataset's reward functions."""
    if task_args.judge:
        from slimrl.patches.judges import PairwiseJudgeReward
        from slimrl.tasks.judges import load_judge

        reward = PairwiseJudgeReward(load_judge(task_args.judge))
        return [reward], f"judge {reward.__name__}"
    return list(task.reward_funcs), "rewards " + ", ".join(f.__name__ for f in task.reward_funcs)


def run_online_dpo(task_args, model_args, training_args) -> dict:
    from transformers.trainer_callback import ProgressCallback
    from trl.experimental.online_dpo import OnlineDPOTrainer

    from slimrl.cli.callbacks import JsonlMetricsCallback, ProgressBarCallback
    from slimrl.cli.grpo import evaluate_task, write_run_outputs
    from slimrl.cli.modeling import add_lora, load_base
    from slimrl.cli.run_control import train

    wall0 = time.perf_counter()
    task = build_online_task(task_args, training_args.seed)
    rewards, ranked_by = ranking(task, task_args)
    out = training_args.output_dir
    os.makedirs(out, exist_ok=True)
    print(
        f"[slimrl] online-dpo on {task.name}: {len(task.train_dataset)} train prompts, {ranked_by}; output_dir {out}",
        flush=True,
    )
    model, tokenizer = load_base(
        model_args.model_name_or_path, model_args.max_seq_length, model_args.dtype, model_args.load_in_4bit
    )
    model = add_lora(model, model_args, bool(training_args.gradient_checkpointing), training_args.seed)
    before = evaluate_task(model, tokenizer, task, task_args, training_args.max_new_tokens, "before")
    trainer = OnlineDPOTrainer(
        model=model,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=task.train_dataset,
        processing_class=tokenizer,
        callbacks=[JsonlMetricsCallback(os.path.join(out, "metrics.jsonl"))],
    )
    bars = [c for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)]
    if not training_args.disable_tqdm and bars:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(ProgressBarCallback(f"online DPO {task.name}", BAR_KEYS))
    train_t0 = time.perf_counter()
    train(trainer, training_args, task_args)  # --resume, Ctrl-C/SIGTERM checkpoint and exit, out-of-memory stop
    train_seconds = time.perf_counter() - train_t0
    trainer.save_model(out)
    after = evaluate_task(trainer.model, tokenizer, task, task_args, training_args.max_new_tokens, "after")
    run_info = {
        "model_name_or_path": model_args.model_name_or_path,
        "dtype": model_args.dtype,
        "algorithm": "online_dpo",
        "task": task.name if not task_args.dataset_name else None,
        "task_info": task.info,
        "ranked_by": ranked_by,
        "max_completion_length": training_args.max_new_tokens,
        "seed": training_args.seed,
    }
    return write_run_outputs(
        out, run_info, before, after, train_seconds, wall0, training_args.max_steps, task_args.plot, online_dpo_panels
    )
