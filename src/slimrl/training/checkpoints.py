"""The checkpoints slimrl writes and resumes from: where a step's checkpoint lives, the newest complete one in a run
folder, and the online trainers' rollout buffer.

1. A checkpoint is the HF Trainer's own (`Trainer._save_checkpoint`: weights or adapter, optimizer, scheduler, RNG
   states, `trainer_state.json`), so `trainer.train(resume_from_checkpoint=...)` reads it unchanged. It counts as
   complete once `trainer_state.json` exists: transformers writes that file last, so a run killed while saving
   leaves a folder that `latest_checkpoint` skips.
2. GRPO and RLOO generate one batch of rollouts and train on it for `steps_per_generation x num_iterations`
   micro-steps (`_buffered_inputs`, counted by `_step`). TRL saves neither, so a resume in the middle of a buffer
   would generate new rollouts with the current weights and shift every later buffer boundary. slimrl saves them in
   each checkpoint (`BUFFER_FILE`, one file per process) and restores them on resume: the resumed run trains on the
   very rollouts the uninterrupted run would have. The file holds ids, masks, advantages and log-probs (kilobytes to
   a few MB, never logits); it is read back with `torch.load(weights_only=True)` (no pickle).
3. The buffer is written before the Trainer's own files, so `trainer_state.json` still marks a complete checkpoint.
"""

from __future__ import annotations

import os
import re
import warnings

import torch

TRAINER_STATE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
BUFFER_FILE = "slimrl_rollout_buffer.pt"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)$")


def checkpoint_dir(trainer, trial=None) -> str:
    """The folder the trainer's `_save_checkpoint` writes for its current global step (transformers' naming; a
    hyperparameter-search trial has its own run folder)."""
    run_dir = trainer.args.output_dir if trial is None else trainer._get_output_dir(trial=trial)
    return os.path.join(run_dir, f"{CHECKPOINT_PREFIX}-{trainer.state.global_step}")


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, TRAINER_STATE))


def latest_checkpoint(folder: str) -> str | None:
    """The complete `checkpoint-N` folder with the largest N in `folder` (None when there is none)."""
    if not os.path.isdir(folder):
        return None
    steps = []
    for name in os.listdir(folder):
        match = _CHECKPOINT_NAME.match(name)
        if match and is_complete(os.path.join(folder, name)):
            steps.append((int(match.group(1)), name))
    return os.path.join(folder, max(steps)[1]) if steps else None


def resolve_resume(path: str) -> str:
    """The checkpoint to resume from: `path` itself when it is one, else the newest complete one inside it; checked
    whole (checkpoint_checks.py: a damaged file is named, nothing is written)."""
    from .checkpoint_checks import check_checkpoint

    if is_complete(path):
        check_checkpoint(path)
        return path
    found = latest_checkpoint(path)
    if found is None:
        where = "does not exist" if not os.path.exists(path) else "holds no complete checkpoint-N folder"
        raise FileNotFoundError(
            f"Cannot resume: {path!r} {where}. Checkpoints are written when a run is stopped with Ctrl-C or SIGTERM, "
            "on an out-of-memory stop, and every --save_steps with --save_strategy steps."
        )
    check_checkpoint(found)
    return found


def run_dir_of(checkpoint: str) -> str:
    """The run folder holding a `checkpoint-N` folder (the folder itself when it is not named like one)."""
    checkpoint = os.path.normpath(checkpoint)
    return os.path.dirname(checkpoint) if _CHECKPOINT_NAME.match(os.path.basename(checkpoint)) else checkpoint


def _buffer_name(trainer) -> str:
    world = getattr(trainer.args, "world_size", 1)
    return BUFFER_FILE if world <= 1 else BUFFER_FILE.replace(".pt", f"_{trainer.args.process_index}.pt")


def has_rollout_buffer(trainer) -> bool:
    return hasattr(trainer, "_buffered_inputs") and hasattr(trainer, "_step")


def save_rollout_buffer(trainer, folder: str) -> None:
    """Write the trainer's rollout buffer and micro-step counter into checkpoint `folder` (every process its own)."""
    if not has_rollout_buffer(trainer) or trainer._buffered_inputs is None:
        return
    os.makedirs(folder, exist_ok=True)
    payload = {
        "step": int(trainer._step),
        "buffer": trainer._buffered_inputs,
        "steps_per_generation": int(trainer.args.steps_per_generation),
        "num_iterations": int(getattr(trainer, "num_iterations", 1)),
    }
    torch.save(payload, os.path.join(folder, _buffer_name(trainer)))


def load_rollout_buffer(trainer, checkpoint: str | None) -> bool:
    """Restore the rollout buffer saved in `checkpoint`; False (TRL's behaviour: regenerate) when there is none or
    the run's buffer geometry changed."""
    if checkpoint is None or not has_rollout_buffer(trainer):
        return False
    path = os.path.join(checkpoint, _buffer_name(trainer))
    if not os.path.isfile(path):
        return False
    payload = torch.load(path, map_location=trainer.accelerator.device, weights_only=True)
    saved = (payload["steps_per_generation"], payload["num_iterations"])
    current = (int(trainer.args.steps_per_generation), int(getattr(trainer, "num_iterations", 1)))
    if saved != current:
        warnings.warn(
            f"The rollout buffer in {checkpoint} was made with (steps_per_generation, num_iterations)={saved}; this "
            f"run has {current}: it is dropped and rollouts are generated afresh (the run no longer repeats the "
            "uninterrupted one exactly).",
            UserWarning,
            stacklevel=2,
        )
        return False
    trainer._step, trainer._buffered_inputs = payload["step"], payload["buffer"]
    return True
