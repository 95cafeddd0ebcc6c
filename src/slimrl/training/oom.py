"""Out of memory in a training step, caught once: the last completed step's checkpoint is kept and the error says
what the step needed and which settings would fit.

What counts as out of memory: `torch.OutOfMemoryError` (CUDA and other accelerators), CPU allocation failures
(PyTorch's "DefaultCPUAllocator: can't allocate memory" RuntimeError), and on any device a measured step peak above
`slimrl_max_memory_gb` (CLI: `--max_memory_gb`), which slimrl enforces after every micro-step from the readings
behind the `peak_memory_gb` metric (slimrl.memory: CUDA's allocator, or the RSS on CPU; counters never reset).

Choices:
1. Caught in the patched `training_step` (slimrl.patches.setup.trainer_setup), where generation, forwards and backwards
   run; once: the error raised is `TrainingOutOfMemory` (a `torch.OutOfMemoryError`, so existing handlers still
   match), and nothing retries.
2. The checkpoint of the last completed step is written as it would have been at that step's end: at the start of
   every optimizer step slimrl records (slimrl.state.TrainerState.step_start) the RNG states, the rollout state
   (`ROLLOUT_STATE`: GRPO/RLOO's or PPO's buffer and micro-step counter) and the token/FLOP counters (a few KB;
   the buffer is a reference, not a copy, so a step that regenerates keeps the previous buffer alive until it
   ends). On the failure the gradients are dropped, those are put back and the trainer's own `_save_checkpoint`
   runs, unless that checkpoint exists already. Nothing is saved when no step completed.
3. The message gives the failing allocation (or the measured peak), the last completed step's measured peak,
   slimrl's plan for this step (slimrl.planning, from the live model and config) and each setting that would fit
   the device (or the budget) by that plan.
"""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass

import numpy as np
import torch

from ..memory import StepPeak, gib
from ..state import trainer_state
from .budget import BUDGET_FIELD, budget_gb
from .checkpoints import checkpoint_dir, is_complete

# what a step advances beyond the HF Trainer's state: GRPO/RLOO's micro-step counter and rollout buffer, slimrl's
# PPO's counter, rollout and episode count (each trainer has some of them)
ROLLOUT_STATE = ("_step", "_buffered_inputs", "_buffer", "_episode")
_CPU_ALLOCATION_FAILURE = "DefaultCPUAllocator: can't allocate memory"


class TrainingOutOfMemory(torch.OutOfMemoryError):
    """A training step ran out of memory (or over slimrl_max_memory_gb); the message says what would fit."""


@dataclass
class StepStart:
    """What a checkpoint at the end of the previous step would have held, recorded when a step begins."""

    global_step: int
    rng: dict
    rollout: dict  # the trainer's ROLLOUT_STATE attributes at the step's start
    counters: tuple  # (num_input_tokens_seen, current_flos)
    last_step_peak: int = 0  # the memory high-water mark when the previous (completed) step ended
    peak: int = 0  # the memory high-water mark after this step's latest micro-step


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and _CPU_ALLOCATION_FAILURE in str(exc)
    )


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def step_start(trainer) -> StepStart:
    """The record for the trainer's current optimizer step, taken at its first micro-step."""
    state = trainer_state(trainer)
    start = state.step_start
    if start is None or start.global_step != trainer.state.global_step:
        rollout = {name: getattr(trainer, name) for name in ROLLOUT_STATE if hasattr(trainer, name)}
        counters = (trainer.state.num_input_tokens_seen, getattr(trainer, "current_flos", 0))
        last = 0 if start is None else start.peak
        start = StepStart(trainer.state.global_step, _rng_state(), rollout, counters, last_step_peak=last)
        state.step_start = start
    return start


def guarded_step(trainer, run):
    """`run()` (TRL's training_step); an out-of-memory error in it stops training as described above."""
    start = step_start(trainer)
    try:
        return run()
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        detail = str(exc).strip().splitlines()[0][:300].rstrip(".")
    # outside the except block: the traceback (and the step's tensors its frames hold) is released
    stop(trainer, start, f"out of memory: {detail}")


def check_budget(trainer, peak: StepPeak) -> None:
    """After a micro-step: record the high-water mark; when what the micro-step is known to have reached
    (StepPeak.known_bytes: its own peak where it raised the mark, else the memory in use at its edges) is over
    slimrl_max_memory_gb, stop training as an out-of-memory does. A mark set before training (loading, a user's
    earlier work) stops nothing by itself."""
    start = step_start(trainer)
    start.peak = max(start.peak, peak.after)
    budget = budget_gb(trainer.args)
    if budget is not None and peak.known_bytes > budget * 1024**3:
        stop(trainer, start, f"measured peak {gib(peak.known_bytes):.2f} GiB is over {BUDGET_FIELD}={budget:g}")


def _restore(trainer, start: StepStart) -> None:
    trainer.model.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    _set_rng_state(start.rng)
    for name, value in start.rollout.items():
        setattr(trainer, name, value)
    trainer.state.num_input_tokens_seen, flos = start.counters
    if hasattr(trainer, "current_flos"):
        trainer.current_flos = flos


def keep_checkpoint(trainer) -> str | None:
    """The last completed step's checkpoint folder, written now unless it exists (None when no step completed)."""
    if trainer.state.global_step == 0:
        return None
    folder = checkpoint_dir(trainer)
    if not is_complete(folder):
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)
    return folder


def stop(trainer, start: StepStart, reason: str) -> None:
    _restore(trainer, start)
    try:
        checkpoint = keep_checkpoint(trainer)
        kept = (
            f"The last completed step's checkpoint is kept: {checkpoint} (resume it with --resume or "
            "resume_from_checkpoint)."
            if checkpoint
            else "No step had completed: there is no checkpoint."
        )
    except Exception as exc:  # noqa: BLE001 - the out-of-memory stays the error; the save failure is reported
        kept = f"The checkpoint of step {trainer.state.global_step} could not be written: {exc}"
    from .oom_message import explain

    raise TrainingOutOfMemory(explain(trainer, start, reason, kept)) from None
