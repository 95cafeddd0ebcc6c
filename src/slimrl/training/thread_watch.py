"""`ThreadWatch`: the callback every patched trainer carries so the busy-machine thread policy follows the jobs that
start or end while it trains (slimrl/machine.py, choice 5). It only asks between steps; the policy decides."""

from __future__ import annotations

from transformers import TrainerCallback

from ..machine import recheck_thread_policy


class ThreadWatch(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        recheck_thread_policy()


def watch_threads(trainer) -> None:
    """Add one ThreadWatch to `trainer` (a second call, e.g. from a patched subclass, adds none)."""
    if not any(isinstance(c, ThreadWatch) for c in trainer.callback_handler.callbacks):
        trainer.add_callback(ThreadWatch())
