"""Stop a training on SIGINT / SIGTERM without losing it: finish the optimizer step, save a resumable checkpoint, exit.

    trainer = GRPOTrainer(..., callbacks=[slimrl.SafeInterrupt()])
    trainer.train()            # Ctrl-C: the step finishes, checkpoint-N is saved, the process exits with 130

Choices:
1. A TrainerCallback plus a signal handler. The handler only records the signal (and says so on stderr); the
   callback's `on_step_end`, which runs after the optimizer step and before transformers' own log/save/evaluate,
   asks for a save and a stop. The checkpoint is therefore the HF Trainer's own (weights or adapter, optimizer,
   scheduler, RNG states, trainer state, plus slimrl's GRPO/RLOO rollout buffer: slimrl.training.checkpoints), and
   `trainer.train(resume_from_checkpoint=...)` or the CLI's `--resume` continue it. A pending evaluation is skipped.
2. A second signal exits at once (`os._exit(128 + signal)`): no checkpoint is written, the last complete one
   stays (a half-written folder has no trainer_state.json and is never picked for resuming).
3. Exit codes follow the shell's convention, 128 + the signal: 130 for SIGINT, 143 for SIGTERM. `SystemExit` is
   raised from `on_train_end`, once the handlers are restored; `exit=False` lets `train()` return instead
   (`interrupted`, `checkpoint` and `exit_code` tell what happened).
4. Several processes (DDP, FSDP, DeepSpeed) must stop after the same step, or the others would wait forever in
   the next collective: each step end, the ranks agree (`any_rank`: one all-reduce of a flag) and all stop when any
   of them got a signal.
5. The handlers live from `on_train_begin` to `on_train_end`. When `train()` died on an exception, on_train_end
   never ran: a signal that finds no HF Trainer code on the stack restores the previous handlers and is delivered
   to them (Ctrl-C raises KeyboardInterrupt as usual). Callers that own the loop call `restore()` in a `finally`.
   Python installs signal handlers only in the main thread; elsewhere a warning says the callback cannot act.
6. With fast_inference, a terminal's Ctrl-C also reaches vLLM's worker processes when they are separate
   processes; `kill -TERM <pid>` reaches the trainer alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

from transformers import TrainerCallback

from .checkpoints import CHECKPOINT_PREFIX

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def any_rank(flag: bool) -> bool:
    """True when `flag` is true on any process of the default process group (the flag itself when there is none)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _trainer_running(frame) -> bool:
    """True when the interrupted code runs inside transformers' Trainer (its train loop is on the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.replace(os.sep, "/").endswith("transformers/trainer.py"):
            return True
        frame = frame.f_back
    return False


def _say(text: str) -> None:
    """One line on stderr, safe inside a signal handler (no buffered-writer re-entry)."""
    try:
        os.write(sys.stderr.fileno(), (text + "\n").encode())
    except (OSError, ValueError, AttributeError):
        pass


class SafeInterrupt(TrainerCallback):
    """On SIGINT/SIGTERM: finish the optimizer step, save a resumable checkpoint, exit with 128 + the signal.

    exit: raise SystemExit at the end of `train()` after an interrupt (False: return normally).
    resume_hint: how to resume, shown in the last line; `{checkpoint}` and `{output_dir}` are filled in
        (default: the `trainer.train(resume_from_checkpoint=...)` call).
    """

    def __init__(self, exit: bool = True, resume_hint: str | None = None, signals=SIGNALS):
        self.exit = exit
        self.resume_hint = resume_hint or 'trainer.train(resume_from_checkpoint="{checkpoint}")'
        self.signals = tuple(signals)
        self.signum: int | None = None  # the first signal received during this train()
        self.stopped_at: int | None = None  # global step after which training stopped for it
        self.checkpoint: str | None = None  # the checkpoint written for it
        self._previous: dict = {}
        self._step = 0

    @property
    def interrupted(self) -> bool:
        return self.stopped_at is not None

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum

    # ---- signal handling ----
    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "SafeInterrupt: train() runs outside the main thread, where Python cannot install signal "
                "handlers; Ctrl-C/SIGTERM will not save a checkpoint.",
                UserWarning,
                stacklevel=3,
            )
            return
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before `install` (idempotent)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not _trainer_running(frame):  # train() is gone (an exception): behave as before SafeInterrupt
            self.restore()
            signal.raise_signal(signum)
            return
        if self.signum is not None:
            _say(f"[slimrl] second {name}: exiting now, without a checkpoint (the last complete one stays).")
            os._exit(128 + signum)
        self.signum = signum
        _say(
            f"[slimrl] {name}: finishing step {self._step + 1}, then saving a checkpoint "
            f"({name} again to quit at once, without one)."
        )

    # ---- TrainerCallback ----
    def on_train_begin(self, args, state, control, **kwargs):
        self.signum, self.stopped_at, self.checkpoint = None, None, None
        self._step = state.global_step
        self.install()

    def on_step_end(self, args, state, control, **kwargs):
        self._step = state.global_step
        if self.stopped_at is None and any_rank(self.signum is not None):
            self.signum = self.signum or signal.SIGTERM  # another process was signalled: stop as for SIGTERM
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at is not None and state.global_step == self.stopped_at:
            self.checkpoint = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()
        if self.signum is None:
            return
        name = signal.Signals(self.signum).name
        if not self.interrupted:  # the signal came after the last step: the run is complete
            _say(f"[slimrl] {name} received as training ended: the run completed.")
            self.signum = None
            return
        hint = self.resume_hint.format(checkpoint=self.checkpoint, output_dir=args.output_dir)
        _say(
            f"[slimrl] stopped by {name} after step {self.stopped_at}/{state.max_steps}; checkpoint "
            f"{self.checkpoint}. Resume: {hint}"
        )
        if self.exit:
            raise SystemExit(self.exit_code)
