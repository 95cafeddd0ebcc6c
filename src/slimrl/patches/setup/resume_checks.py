"""Every patched trainer's `train`: the checkpoint a resume names is checked whole before TRL's `train` reads it
(slimrl.training.checkpoint_checks: a damaged or missing file is named, and nothing is written), and on transformers
before 5.23 its root "default" adapter is loaded when it sits beside other adapters, which those releases skip
(slimrl.training.adapter_resume).

Patched: `train(resume_from_checkpoint=...)`, only when a checkpoint is given (a path, or True: the newest in
output_dir, found as transformers finds it; none found is left to transformers' own error). TRL's own: all of it.
"""

from __future__ import annotations

import functools
import os

from ...training.adapter_resume import restore_root_adapter
from ...training.checkpoint_checks import check_checkpoint
from ..seams import Patch


def checkpoint_to_resume(trainer, resume_from_checkpoint) -> str | None:
    """The folder `train(resume_from_checkpoint=...)` will read, or None."""
    if resume_from_checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(trainer.args.output_dir) if os.path.isdir(trainer.args.output_dir) else None
    if isinstance(resume_from_checkpoint, (str, os.PathLike)) and os.fspath(resume_from_checkpoint):
        return os.fspath(resume_from_checkpoint)
    return None


def check_resume(trainer, resume_from_checkpoint) -> str | None:
    """The checkpoint folder checked whole; returned when it exists (a missing one: transformers' own error)."""
    folder = checkpoint_to_resume(trainer, resume_from_checkpoint)
    if folder is None or not os.path.isdir(folder):
        return None
    check_checkpoint(folder)
    return folder


def make_train(original):
    @functools.wraps(original)
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        folder = check_resume(self, resume_from_checkpoint)
        restore_root_adapter(self.model, folder)
        return original(self, resume_from_checkpoint, *args, **kwargs)

    return train


def resume_check_patch(trainer_path: str, params: tuple[str, ...] = ("self", "resume_from_checkpoint")) -> Patch:
    """`params`: the leading parameters of the trainer's `train`; one that forwards `*args` to transformers' `train`
    (A2PO's) passes its first positional argument as `resume_from_checkpoint` all the same."""
    return Patch(
        trainer_path,
        "train",
        params,
        make_train,
        "damaged checkpoint files named on resume; the trained adapter read back (transformers < 5.23)",
    )
