"""The one skeleton every training command runs (`slimrl grpo | ppo | dpo | orpo | kto | gkd | online-dpo`):

    model + LoRA → greedy eval before → trainer (metrics.jsonl, progress bar) → train (run_control.train: --resume,
    Ctrl-C/SIGTERM, out-of-memory stop) → adapter saved → eval after → vLLM engine closed, trainer ended →
    slimrl_run.json, eval.json, training_curves.png (write_run_outputs)

Each command supplies what differs, as a `RunSpec`: how its trainer is built, the progress bar, the evaluation's
completion length, the run record's fields and the plot panels.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunSpec:
    """What one training command adds to the skeleton."""

    make_trainer: Callable  # (model, tokenizer, callbacks) -> trainer
    bar_title: str  # the progress bar's label
    max_new_tokens: int  # completion length of the before/after evaluation
    run_info: dict = field(default_factory=dict)  # slimrl_run.json fields beyond the model, dtype, task and seed
    bar_keys: Any = None  # the metrics the bar shows (None: ProgressBarCallback's default)
    panels: Callable | None = None  # the plot's panels (None: GRPO's)


def _swap_progress_bar(trainer, training_args, spec: RunSpec) -> None:
    from transformers.trainer_callback import ProgressCallback

    from .callbacks import ProgressBarCallback

    callbacks = trainer.callback_handler.callbacks
    if not training_args.disable_tqdm and any(isinstance(c, ProgressCallback) for c in callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(ProgressBarCallback(spec.bar_title, spec.bar_keys))


def run_training(task, spec: RunSpec, task_args, model_args, training_args, wall0: float) -> dict:
    """Train on `task` as the module docstring says; returns the summary write_run_outputs wrote."""
    from .callbacks import JsonlMetricsCallback
    from .modeling import add_lora, load_base
    from .run_control import train

    out = training_args.output_dir
    model, tokenizer = load_base(
        model_args.model_name_or_path, model_args.max_seq_length, model_args.dtype, model_args.load_in_4bit, model_args
    )
    model = add_lora(model, model_args, bool(training_args.gradient_checkpointing), training_args.seed)
    os.makedirs(out, exist_ok=True)  # only now: a model that cannot load leaves nothing behind
    before = evaluate_task(model, tokenizer, task, task_args, spec.max_new_tokens, "before")
    trainer = spec.make_trainer(model, tokenizer, [JsonlMetricsCallback(os.path.join(out, "metrics.jsonl"))])
    _swap_progress_bar(trainer, training_args, spec)
    train_t0 = time.perf_counter()
    train(trainer, training_args, task_args)
    train_seconds = time.perf_counter() - train_t0
    trainer.save_model(out)
    after = evaluate_task(trainer.model, tokenizer, task, task_args, spec.max_new_tokens, "after")
    run_info = {
        "model_name_or_path": model_args.model_name_or_path,
        "dtype": model_args.dtype,
        "task": task.name if not task_args.dataset_name else None,
        "task_info": task.info,
        "seed": training_args.seed,
        **spec.run_info,
    }
    engine = getattr(model, "vllm_engine", None)
    if engine is not None:
        engine.close()  # before trainer.end() destroys the process group vLLM set up
    if hasattr(trainer, "end"):
        trainer.end()
    return write_run_outputs(
        out, run_info, before, after, train_seconds, wall0, training_args.max_steps, task_args.plot, spec.panels
    )


def evaluate_task(model, tokenizer, task, task_args, max_new_tokens: int, label: str):
    """Greedy held-out accuracy of `task` (None when the task has no eval split or accuracy reward)."""
    from slimrl.cli.evaluate import evaluate_accuracy
    from slimrl.cli.modeling import set_inference

    if not task_args.num_eval_samples or task.eval_dataset is None or task.accuracy_reward is None:
        return None
    print(  # up to a minute on a CPU: said before it starts
        f"[slimrl] evaluating {label}: {len(task.eval_dataset)} held-out prompts, greedy, up to {max_new_tokens} "
        "new tokens each ...",
        file=sys.stderr,
        flush=True,
    )
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
