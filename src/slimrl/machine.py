"""The CPU this process runs on, and how torch's threads should behave on it when other jobs share it.

Measured (`bench/busy_machine.py`, 2-core Xeon, a small GRPO step, median s/step; README "A busy machine"):

    arm                          quiet   beside 1 torch job   beside 2 torch jobs
    torch's defaults (2 threads)  0.48        9.16 (19x)           3.26 (6.8x)
    OMP_WAIT_POLICY=PASSIVE        0.83           -                 1.70 (2.1x)
    1 thread                       0.68           -                 1.54 (2.3x)
    PASSIVE + 1 thread             0.68        0.91 (1.3x)          1.53 (2.3x)

Choices:
1. torch's defaults stay where the machine is quiet: they are the fastest there (0.48 vs 0.68 s/step).
2. Where other jobs run, the training commands take the arm that degrades least: OMP_WAIT_POLICY=PASSIVE and one
   thread fewer per running job (at least 1). "Running" is the kernel's count of runnable tasks now (/proc/loadavg,
   sampled 5 times over 0.2 s, median, this process excluded), not the 1-minute load average, which still counts a
   job that ended a minute ago (misjudging a quiet machine costs 1.4x, a busy one 6.8-19x).
3. The user's own OMP_NUM_THREADS / OMP_WAIT_POLICY win, always, and silence the adjustment; an adjustment is said
   in one line naming the old and new values. It is applied to the environment before torch is imported (libgomp
   reads it once), so only the `slimrl` command does it (`slimrl.cli:run`), not `slimrl.cli.main` called in-process.
"""

from __future__ import annotations

import os
import statistics
import time

USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def other_running_jobs(samples: int = 5, interval: float = 0.05) -> int:
    """Runnable tasks other than this process, now (median of a few /proc/loadavg readings; 0 where unreadable)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return 0
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, int(statistics.median(counts)))


def busy_thread_settings(others: int, cores: int, environ) -> dict[str, str]:
    """The environment variables the training commands set beside `others` running jobs (empty: torch's defaults)."""
    if others < 1 or any(name in environ for name in USER_THREAD_VARIABLES):
        return {}
    threads = max(1, cores - others)
    return {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def describe(others: int, cores: int, settings: dict[str, str]) -> str:
    """One line: the other jobs, and what the training commands do about them."""
    if not settings:
        return f"{others} other running job(s) on {cores} cores: torch's default threads"
    return (
        f"{others} other running job(s) on {cores} cores: torch threads {cores} -> "
        f"{settings['OMP_NUM_THREADS']}, OMP_WAIT_POLICY unset -> PASSIVE (set OMP_NUM_THREADS to choose)"
    )


def adapt_threads_to_load(environ=None) -> str | None:
    """Apply `busy_thread_settings` to `environ` (os.environ); the one-line description when it changed anything."""
    environ = os.environ if environ is None else environ
    others, cores = other_running_jobs(), usable_cores()
    settings = busy_thread_settings(others, cores, environ)
    environ.update(settings)
    return describe(others, cores, settings) if settings else None
