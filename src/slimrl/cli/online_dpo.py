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
  `module.Class` / `file.py:Class`), turned into the reward TRL 1.16 takes by slimrl.patches.rollouts.judges.
- The reference is the adapter-disabled base (TRL's own behaviour with LoRA).
- CLI defaults differ from TRL's where a 2-core CPU needs it (`ONLINE_DPO_CLI_DEFAULTS`, marked in --help).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slimrl.cli.args import SHORT_RUN_DEFAULTS, TaskArguments

DEFAULT_OUTPUT_DIR = "outputs/slimrl-online-dpo-{task}"
BAR_KEYS = {"score": "objective/scores", "margin": "rewards/margins", "kl": "objective/kl"}

# OnlineDPOConfig field -> (CLI default, why). Basis: the bare command's run on the embedded SmolLM2-135M.
ONLINE_DPO_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    **SHORT_RUN_DEFAULTS,
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (5e-5, "LoRA needs a far larger step than full fine-tuning's 5e-7 to move in 30 steps"),
    "max_steps": (30, "a few minutes on a 2-core CPU"),
    "per_device_train_batch_size": (4, "4 prompts x 2 completions per step"),
    "max_new_tokens": (16, "an answer `<answer>18</answer>` is 8 tokens; TRL's 64 only costs generation time"),
    "max_length": (256, "prompt + answer of the arithmetic task fit in ~150 tokens"),
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
    from trl.experimental.online_dpo import OnlineDPOConfig

    from slimrl.cli.args import ModelArguments, OnlineSlimrlArguments, command_parser

    summary = (
        "Train a model with online DPO (TRL's experimental OnlineDPOTrainer on slimrl's memory paths): two "
        "completions per prompt, the better by reward or judge chosen."
    )
    arguments = (OnlineDPOTaskArguments, ModelArguments, OnlineSlimrlArguments, OnlineDPOConfig)
    return command_parser(arguments, "slimrl online-dpo", summary, ONLINE_DPO_CLI_DEFAULTS)


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
    from slimrl.fast_language_model import FastLanguageModel
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

    return build_task(task_args, seed, require_rewards=not task_args.judge)


def ranking(task, task_args) -> tuple[list, str]:
    """(reward functions, description): the judge's reward, or the task's / dataset's reward functions."""
    if task_args.judge:
        from slimrl.patches.rollouts.judges import PairwiseJudgeReward
        from slimrl.tasks.judges import load_judge

        reward = PairwiseJudgeReward(load_judge(task_args.judge))
        return [reward], f"judge {reward.__name__}"
    return list(task.reward_funcs), "rewards " + ", ".join(f.__name__ for f in task.reward_funcs)


def run_online_dpo(task_args, model_args, training_args) -> dict:
    from trl.experimental.online_dpo import OnlineDPOTrainer

    from slimrl.cli.training_run import RunSpec, run_training

    wall0 = time.perf_counter()
    task = build_online_task(task_args, training_args.seed)
    rewards, ranked_by = ranking(task, task_args)
    out = training_args.output_dir
    print(
        f"[slimrl] online-dpo on {task.name}: {len(task.train_dataset)} train prompts, {ranked_by}; output_dir {out}",
        flush=True,
    )

    def make_trainer(model, tokenizer, callbacks):
        return OnlineDPOTrainer(
            model=model,
            reward_funcs=rewards,
            args=training_args,
            train_dataset=task.train_dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    max_new_tokens = training_args.max_new_tokens
    run_info = {"algorithm": "online_dpo", "ranked_by": ranked_by, "max_completion_length": max_new_tokens}
    spec = RunSpec(make_trainer, f"online DPO {task.name}", max_new_tokens, run_info, BAR_KEYS, online_dpo_panels)
    return run_training(task, spec, task_args, model_args, training_args, wall0)
