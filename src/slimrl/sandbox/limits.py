"""Time limits: Unsloth's `@execute_with_time_limit(seconds)` decorator, and the deadline sandboxed calls obey.

The decorated function is the user's own code (a game loop, a reward): it runs in the trainer's process, as in
Unsloth, and gets a deadline. Two things enforce it:
- every call of a sandboxed function inside it waits at most until the deadline, then stops the sandbox process and
  raises TimeoutError (any thread);
- in the main thread, SIGALRM (as Unsloth's default) interrupts the user's code itself with TimeoutError, so a loop
  that never calls the sandboxed function cannot run on either. An earlier timer someone else armed is respected
  and put back afterwards.
A function that returns after its deadline without being interrupted (stuck in C code) raises TimeoutError too.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import signal
import threading
import time

_DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "slimrl_sandbox_deadline", default=None
)  # (time.monotonic() deadline, the limit in seconds it came from)
LATE_LEEWAY_SECONDS = 0.05


def current_deadline() -> tuple[float, float] | None:
    """(monotonic deadline, its limit in seconds) of the innermost enclosing time limit, or None."""
    return _DEADLINE.get()


def check_seconds(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"the time limit must be a number of seconds > 0, got {seconds!r}")
    return float(seconds)


def execute_with_time_limit(seconds: float):
    """Decorator: the function raises TimeoutError("Timed out after {seconds}s") once it runs past `seconds`."""
    seconds = check_seconds(seconds)

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with time_limit(seconds):
                return func(*args, **kwargs)

        return wrapper

    return decorator


def timeout_error(seconds: float) -> TimeoutError:
    return TimeoutError(f"Timed out after {seconds:g}s")


@contextlib.contextmanager
def time_limit(seconds: float):
    """The body raises TimeoutError past `seconds` (or an enclosing limit's earlier deadline)."""
    seconds = check_seconds(seconds)
    start = time.monotonic()
    outer = _DEADLINE.get()
    mine = (start + seconds, seconds)
    token = _DEADLINE.set(mine if outer is None or mine[0] < outer[0] else outer)
    restore = _no_alarm
    try:
        restore = _arm_alarm(seconds)
        yield
    finally:
        try:
            restore()
        finally:  # even when the alarm fired inside restore(): the deadline never outlives the block
            _DEADLINE.reset(token)
    if time.monotonic() > mine[0] + LATE_LEEWAY_SECONDS:
        raise timeout_error(seconds)


def _no_alarm() -> None:
    return None


def _arm_alarm(seconds: float):
    """Arm SIGALRM for `seconds` where possible; returns the function that puts the previous state back."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return _no_alarm
    previous_left, previous_interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < previous_left <= seconds:  # an earlier timer fires first: leave it alone
        return _no_alarm

    def on_alarm(signum, frame):
        raise timeout_error(seconds)

    start = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def restore():
        # SIGALRM blocked while the timer and handler go back, and an alarm that fired meanwhile dropped: it would
        # otherwise reach the previous handler (by default, the end of the process) once unblocked
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if signal.SIGALRM in signal.sigpending():
                signal.sigtimedwait({signal.SIGALRM}, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)
            if previous_left > 0:
                left = max(previous_left - (time.monotonic() - start), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, left, previous_interval)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})

    return restore
