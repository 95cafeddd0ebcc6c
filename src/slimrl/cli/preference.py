"""`slimrl dpo | orpo | kto`: preference data → model + LoRA → eval before → TRL trainer.train → adapter, metrics, plot.

Choices made:
- Same shape as `slimrl grpo` (see grpo.py): cheap checks (dataset, columns) before the model loads, PatchFastRL
  applied before parsing (a bare config builds on a CPU), the LoRA adapter, `metrics.jsonl`, `training_curves.png`,
  `eval.json` and `slimrl_run.json` in output_dir.
- The bare command trains on the built-in arithmetic preference set (tasks/preference.py); its held-out split is the
  GRPO task's, so "accuracy before/after" is the same greedy evaluation as `slimrl grpo`. A user dataset has no such
  accuracy: TRL's own pair accuracy (`rewards/accuracies`) is in the metrics and the plot.
- With LoRA and no reference model, DPO and KTO use the adapter-disabled base as the reference (TRL's own behaviour);
  ORPO is reference-free.
"""

from __future__ import annotations

import os
import time

PREFERENCE_MAX_NEW_TOKENS = 16  # completion length of the before/after evaluation


def trainer_class(algorithm: str):
    if algorithm == "dpo":
        from trl import DPOTrainer as trainer
    elif algorithm == "kto":
        from trl import KTOTrainer as trainer
    else:
        from trl.experimental.orpo import ORPOTrainer as trainer
    return trainer


def apply_patches(algorithm: str) -> None:
    from slimrl.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL(algorithm, FastLanguageModel)


def build_preference_task(algorithm: str, task_args, seed: int):
    """`Task` with the train set TRL's trainer reads and, for the built-in set, the held-out GRPO prompts."""
    from slimrl.tasks import Task
    from slimrl.tasks.preference import arithmetic_preference_splits, preference_dataset
    from slimrl.tasks.rewards import correctness_reward

    if task_args.dataset_name:
        train = preference_dataset(
            algorithm,
            task_args.dataset_name,
            task_args.dataset_config,
            task_args.dataset_train_split,
            task_args.prompt_column,
            task_args.chosen_column,
            task_args.rejected_column,
            task_args.completion_column,
            task_args.label_column,
            task_args.num_train_samples,
        )
        name = os.path.basename(task_args.dataset_name.rstrip("/")) or task_args.dataset_name
        return Task(name, train, None, [], None, None, {"dataset_name": task_args.dataset_name})
    if task_args.task != "arithmetic":
        raise ValueError(f"Unknown preference task {task_args.task!r}; built-in: arithmetic (or pass --dataset_name)")
    options = {k: getattr(task_args, k) for k in ("max_operand", "operations", "num_examples")}
    train, evaluation = arithmetic_preference_splits(
        algorithm, task_args.num_train_samples or 1000, task_args.num_eval_samples, seed, **options
    )
    return Task(
        "arithmetic",
        train,
        evaluation,
        [],
        correctness_reward,
        None,
        {k: v for k, v in options.items() if v is not None},
    )


def run_preference(algorithm: str, task_args, model_args, training_args) -> dict:
    from slimrl.cli.callbacks import PREFERENCE_BAR_KEYS
    from slimrl.cli.training_run import RunSpec, run_training
    from slimrl.plotting import preference_panels

    wall0 = time.perf_counter()
    task = build_preference_task(algorithm, task_args, training_args.seed)
    out = training_args.output_dir
    print(f"[slimrl] {algorithm} on {task.name}: {len(task.train_dataset)} train rows; output_dir {out}", flush=True)

    def make_trainer(model, tokenizer, callbacks):
        return trainer_class(algorithm)(
            model=model,
            args=training_args,
            train_dataset=task.train_dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )

    spec = RunSpec(
        make_trainer,
        f"{algorithm.upper()} {task.name}",
        PREFERENCE_MAX_NEW_TOKENS,
        {"algorithm": algorithm},
        PREFERENCE_BAR_KEYS,
        preference_panels,
    )
    return run_training(task, spec, task_args, model_args, training_args, wall0)
