"""`slimrl ppo`: task → model + LoRA → eval before → slimrl's PPOTrainer.train → adapter, metrics, plot → eval after.

Choices made:
- The same conventions and outputs as `slimrl grpo` (its parsing, task, model, evaluation and output helpers are
  reused): every PPOConfig field is a flag through TRL's TrlParser, `--config run.yaml` works (an unknown key named
  with the closest flag), the model/LoRA/task flags and slimrl's own (`--slimrl_num_chunks`) are grpo's, errors
  print as one line (cli/face.py), and output_dir receives the adapter, `metrics.jsonl`, `training_curves.png`,
  `eval.json` and `slimrl_run.json`. Cheap checks run before the model loads.
- The score: the built-in arithmetic task's correctness reward (1 when the answer is right), the quantity the
  before/after accuracy measures; with `--dataset_name`, the sum of `--reward_funcs`. The critic (value adapter +
  head) turns that sparse end-of-answer score into per-token advantages.
- `PatchFastRL("ppo")` is applied first, so a script-style `from trl import PPOTrainer` in the same process sees
  the same class; the CLI itself uses slimrl.ppo directly.
- CLI defaults differ from TRL's PPO where a 2-core CPU needs it (`PPO_CLI_DEFAULTS`, marked in --help by
  cli/args.py's set_cli_defaults; "TRL" there is TRL's PPO default, which PPOConfig keeps).
"""

from __future__ import annotations

import time

from slimrl.cli.args import SHORT_RUN_DEFAULTS

DEFAULT_OUTPUT_DIR = "outputs/slimrl-ppo-{task}"
PPO_BAR_KEYS = {"score": "objective/scores", "kl": "objective/kl", "value": "loss/value_avg"}

# PPOConfig field -> (CLI default, why). Basis: the runs in README.md, "PPO" (embedded SmolLM2-135M, arithmetic task).
PPO_CLI_DEFAULTS: dict[str, tuple[object, str]] = {
    **SHORT_RUN_DEFAULTS,
    "output_dir": (DEFAULT_OUTPUT_DIR, "{task} is replaced by the task or dataset name"),
    "learning_rate": (1e-4, "LoRA needs a far larger step than full fine-tuning's to move in a few dozen steps"),
    "max_steps": (40, "20 rollouts of 16 prompts x 2 PPO epochs"),
    "per_device_train_batch_size": (8, "8 rows per forward/backward"),
    "gradient_accumulation_steps": (2, "one optimizer step = 16 rows = one rollout (num_mini_batches 1)"),
    "num_ppo_epochs": (2, "two passes per rollout; TRL's 4 doubles the training time per rollout on a CPU"),
    "response_length": (16, "an answer `<answer>18</answer>` is 8 tokens; longer samples only cost generation time"),
    "stop_token": ("eos", "responses end at the chat turn's end token (TRL's None runs every response to the limit)"),
}


def build_ppo_parser():
    from slimrl.cli.args import ModelArguments, SlimrlArguments, TaskArguments, command_parser
    from slimrl.ppo import PPOConfig

    summary = (
        "Train a model with PPO (slimrl's PPOTrainer: LoRA policy, the adapter-disabled base as reference, a value "
        "adapter + head on the same base)."
    )
    return command_parser(
        (TaskArguments, ModelArguments, SlimrlArguments, PPOConfig), "slimrl ppo", summary, PPO_CLI_DEFAULTS
    )


def parse_ppo_args(argv: list[str]):
    """(task_args, model_args, training_args) for `slimrl ppo` (grpo's conventions: cli/args.py)."""
    from slimrl.cli.args import parse_online_args

    return parse_online_args(build_ppo_parser(), argv)


def apply_patches() -> None:
    from slimrl.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL("ppo", FastLanguageModel)


def ppo_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    return [
        ("score", ["objective/scores", "objective/rlhf_reward"]),
        ("KL", ["objective/kl"]),
        ("losses", ["loss/policy_avg", "loss/value_avg"]),
    ]


def score_functions(task, task_args) -> list:
    """The built-in task's correctness reward (its accuracy), or the dataset's reward functions."""
    if task_args.dataset_name:
        return list(task.reward_funcs)
    if task.accuracy_reward is None:
        raise ValueError(f"task {task.name!r} has no accuracy reward to use as the PPO score")
    return [task.accuracy_reward]


def run_ppo(task_args, model_args, training_args) -> dict:
    from slimrl.cli.grpo import build_task
    from slimrl.cli.training_run import RunSpec, run_training
    from slimrl.ppo import PPOTrainer

    wall0 = time.perf_counter()
    task = build_task(task_args, training_args.seed)
    scores = score_functions(task, task_args)
    out = training_args.output_dir
    print(
        f"[slimrl] ppo on {task.name}: {len(task.train_dataset)} train prompts, score "
        f"{', '.join(f.__name__ for f in scores)}; output_dir {out}",
        flush=True,
    )

    def make_trainer(model, tokenizer, callbacks):
        return PPOTrainer(
            args=training_args,
            processing_class=tokenizer,
            model=model,
            reward_funcs=scores,
            train_dataset=task.train_dataset,
            callbacks=callbacks,
        )

    spec = RunSpec(
        make_trainer,
        f"PPO {task.name}",
        training_args.response_length,
        {"algorithm": "ppo", "max_completion_length": training_args.response_length},
        PPO_BAR_KEYS,
        ppo_panels,
    )
    return run_training(task, spec, task_args, model_args, training_args, wall0)
