"""`slimrl grpo`: task → model + LoRA → eval before → GRPOTrainer.train → adapter, metrics, plot → eval after.

Choices made:
- All cheap checks (task/dataset/reward functions) run before the model loads, so a typo fails in seconds.
- `PatchFastRL("grpo")` is applied before the arguments are parsed: it makes a bare GRPOConfig build on a CPU
  (bf16/fp16 resolved from the device) and runs TRL on slimrl's memory paths.
- Outputs in output_dir: the LoRA adapter in PEFT format (+ tokenizer), `metrics.jsonl`, `training_curves.png`,
  `eval.json` (accuracy before/after), `slimrl_run.json` (base model and task, read by `slimrl generate`).
- The trainer gets no eval_dataset unless the user turns TRL's evaluation on (`--eval_strategy steps`): the
  before/after accuracy is slimrl's own greedy evaluation.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("slimrl")


def apply_patches() -> None:
    # No fallback to stock TRL: a patch that cannot apply raises (PatchError names the seam and the TRL version)
    from slimrl.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL("grpo", FastLanguageModel)


def build_task(task_args, seed: int, require_rewards: bool = True):
    """The built-in task, or the `--dataset_name` task (`require_rewards=False`: ranked by a judge instead)."""
    from slimrl.tasks import get_builtin_task
    from slimrl.tasks.custom import dataset_task

    if task_args.dataset_name:
        return dataset_task(
            task_args.dataset_name,
            task_args.reward_funcs,
            task_args.dataset_config,
            task_args.prompt_column,
            task_args.dataset_train_split,
            task_args.dataset_test_split,
            task_args.num_train_samples,
            task_args.num_eval_samples,
            seed,
            task_args.accuracy_reward,
            require_rewards=require_rewards,
        )
    if task_args.reward_funcs:
        raise ValueError("--reward_funcs applies to --dataset_name; built-in tasks bring their own rewards")
    options = {k: getattr(task_args, k) for k in ("max_operand", "operations", "num_examples")}
    return get_builtin_task(
        task_args.task,
        num_train_samples=task_args.num_train_samples or 1000,
        num_eval_samples=task_args.num_eval_samples,
        seed=seed,
        **options,
    )


def run_grpo(task_args, model_args, training_args) -> dict:
    from trl import GRPOTrainer

    from slimrl.cli.training_run import RunSpec, run_training

    wall0 = time.perf_counter()
    task = build_task(task_args, training_args.seed)
    out = training_args.output_dir
    n_eval = len(task.eval_dataset) if task.eval_dataset is not None else 0
    print(
        f"[slimrl] task {task.name}: {len(task.train_dataset)} train / {n_eval} eval prompts; output_dir {out}",
        flush=True,
    )
    eval_on = getattr(training_args.eval_strategy, "value", training_args.eval_strategy) != "no"

    def make_trainer(model, tokenizer, callbacks):
        return GRPOTrainer(
            model=model,
            reward_funcs=task.reward_funcs,
            args=training_args,
            train_dataset=task.train_dataset,
            eval_dataset=task.eval_dataset if eval_on else None,
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    spec = RunSpec(
        make_trainer,
        f"GRPO {task.name}",
        training_args.max_completion_length,
        {"max_completion_length": training_args.max_completion_length},
    )
    return run_training(task, spec, task_args, model_args, training_args, wall0)
