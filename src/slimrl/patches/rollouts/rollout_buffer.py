"""GRPO / RLOO checkpoints that resume in the middle of a rollout buffer exactly (slimrl.training.checkpoints).

Patched: `_save_checkpoint` writes the rollout buffer and micro-step counter into the checkpoint folder first, then
runs TRL's / transformers' own save; `_load_optimizer_and_scheduler` (called by `Trainer.train` with the
checkpoint it resumes from) runs the original, then restores them. TRL's own: every other file of the checkpoint.
"""

from __future__ import annotations

import functools

from ...training.checkpoints import checkpoint_dir, load_rollout_buffer, save_rollout_buffer
from ..seams import Patch


def make_save_checkpoint(original):
    @functools.wraps(original)
    def _save_checkpoint(self, model, trial, *args, **kwargs):
        save_rollout_buffer(self, checkpoint_dir(self, trial))
        return original(self, model, trial, *args, **kwargs)

    return _save_checkpoint


def make_load_optimizer_and_scheduler(original):
    @functools.wraps(original)
    def _load_optimizer_and_scheduler(self, checkpoint, *args, **kwargs):
        result = original(self, checkpoint, *args, **kwargs)
        load_rollout_buffer(self, checkpoint)
        return result

    return _load_optimizer_and_scheduler


def rollout_buffer_patches(trainer_path: str) -> list[Patch]:
    return [
        Patch(
            trainer_path,
            "_save_checkpoint",
            ("self", "model", "trial"),
            make_save_checkpoint,
            "the rollout buffer saved with every checkpoint",
        ),
        Patch(
            trainer_path,
            "_load_optimizer_and_scheduler",
            ("self", "checkpoint"),
            make_load_optimizer_and_scheduler,
            "the rollout buffer restored on resume",
        ),
    ]
