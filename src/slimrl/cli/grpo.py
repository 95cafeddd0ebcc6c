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

import json
import logging
import os
import time

logger = logging.getLogger("slimrl")


def apply_patches() -> None:
    # No fallback to stock TRL: a patch that cannot apply raises (PatchError names the seam and the TRL version)
    from slimrl.fast_language_model import FastLanguageModel
    from slimrl.patches.registry import PatchFastRL

    PatchFastRL("grpo", FastLanguageModel)


def build_task(task_args, seed: int):
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


def evaluate_task(model, tokenizer, task, task_args, max_new_tokens: int, label: str):
    """Greedy held-out accuracy of `task` (None when the task has no eval split or accuracy reward)."""
    from slimrl.cli.evaluate import evaluate_accuracy
    from slimrl.cli.modeling import set_inference

    if not task_args.num_eval_samples or task.eval_dataset is None or task.accuracy_reward is None:
        return None
    t0 = time.perf_counter()
    set_inference(model, True)
    try:
        result = evaluate_accuracy(
            model, tokenizer, task.eval_dataset, task.accuracy_reward, max_new_tokens, task_args.eval_batch_size
        )
    finally:
        set_inference(model, False)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(
        f"[slimrl] eval accuracy {label}: {result['accuracy']:.3f} on {result['n']} held-out prompts "
        f"({result['seconds']} s, greedy)",
        flush=True,
    )
    return result


def write_run_outputs(
    out: str, run_info: dict, before, after, train_seconds: float, wall0: float, max_steps: int, plot: bool, panels=None
) -> dict:
    """`slimrl_run.json`, `eval.json` and `training_curves.png` in `out`, the closing lines printed; the summary."""
    with open(os.path.join(out, "slimrl_run.json"), "w") as f:
        json.dump(run_info, f, indent=2)
    summary = {
        "accuracy_before": before and before["accuracy"],
        "accuracy_after": after and after["accuracy"],
        "eval_before": before,
        "eval_after": after,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.perf_counter() - wall0, 1),
        "max_steps": max_steps,
    }
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if plot:
        try:
            from slimrl.plotting import grpo_panels, plot_metrics

            summary["plot"] = plot_metrics(
                os.path.join(out, "metrics.jsonl"), os.path.join(out, "training_curves.png"), panels or grpo_panels
            )
        except ImportError as exc:
            print(f"[slimrl] no plot: {exc}")
    print(
        f"[slimrl] adapter, metrics.jsonl, eval.json{' and training_curves.png' if summary.get('plot') else ''} "
        f"saved to {out} (train {summary['train_seconds']} s, wall {summary['wall_seconds']} s)",
        flush=True,
    )
    if before and after:
        print(f"[slimrl] accuracy before {before['accuracy']:.3f} -> after {after['accuracy']:.3f}", flush=True)
    from slimrl.cli.export import export_hint

    print(export_hint(out), flush=True)
    return summary


def run_grpo(task_args, model_args, training_args) -> dict:
    from trl import GRPOTrainer

    from slimrl.cli.training_run import RunSpec, run_training

    wall0 = time.perf_counter()
    task = build_task(task_args, training_args.seed)
    out = training_args.output_dir
    os.makedirs(out, exist_ok=True)
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
