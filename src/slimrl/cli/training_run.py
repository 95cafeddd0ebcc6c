"""The one skeleton every training command runs (`slimrl grpo | ppo | dpo | orpo | kto`):

    model + LoRA → greedy eval before → trainer (metrics.jsonl, progress bar) → train (run_control.train: --resume,
    Ctrl-C/SIGTERM, out-of-memory stop) → adapter saved → eval after → vLLM engine closed, trainer ended →
    slimrl_run.json, eval.json, training_curves.png (cli/grpo.py:write_run_outputs)

Each command supplies what differs, as a `RunSpec`: how its trainer is built, the progress bar, the evaluation's
completion length, the run record's fields and the plot panels.
"""

from __future__ import annotations

import os
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
    from .grpo import evaluate_task, write_run_outputs
    from .modeling import add_lora, load_base
    from .run_control import train

    out = training_args.output_dir
    model, tokenizer = load_base(
        model_args.model_name_or_path, model_args.max_seq_length, model_args.dtype, model_args.load_in_4bit, model_args
    )
    model = add_lora(model, model_args, bool(training_args.gradient_checkpointing), training_args.seed)
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
