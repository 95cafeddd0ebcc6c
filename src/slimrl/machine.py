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
3. The user's own OMP_NUM_THREADS / MKL_NUM_THREADS / OMP_WAIT_POLICY win, always, and silence the adjustment; so do
   `SLIMRL_THREADS=keep` and a thread count the user set with `torch.set_num_threads` (torch's count differs from
   the one torch picks by itself: OMP_NUM_THREADS, else its physical cores). An adjustment is said in one line naming
   the old and new values.
4. One policy, applied once per process (`adapt_threads_to_load`), wherever it runs first: the `slimrl` command before
   torch is imported (`slimrl.cli:run`: the environment, which libgomp reads once, so PASSIVE too), and every patched
   trainer's `__init__` (patches/setup/trainer_setup.py: scripts and notebooks through the Python API, import-time
   patching
   and PatchFastRL alike). There torch is loaded, so only its thread count can change (`torch.set_num_threads`);
   on 2 cores that is the arm that matters (1 thread has no other thread to wait for). `slimrl.cli.main` called
   in-process changes nothing.
5. A running trainer looks again between steps, at most every RECHECK_SECONDS (`recheck_thread_policy`, a
   callback patches/setup/trainer_setup.py adds): a job that arrives after training started lowers its threads too, and
   slimrl's own lowering is undone once the machine is quiet again (torch's own count back). Only threads slimrl
   manages: where the user chose (choice 3) nothing is watched, and a count the user sets during training ends the
   watch. This process's own running threads are not counted as other jobs (its OpenMP workers spin between ops).
"""

from __future__ import annotations

import glob
import os
import statistics
import sys
import time

from .notices import notice
from .swaps import ProcessValue

USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")
OPT_OUT_VARIABLE = "SLIMRL_THREADS"  # "keep": slimrl never changes torch's threads
OPT_OUT_VALUE = "keep"
_APPLIED = ProcessValue("thread_policy_applied", False, "the busy-machine thread policy ran (slimrl.machine)")
# choice 5: {"default": torch's own count, "threads": the count slimrl left torch at (None until the first look),
# "last": when it last looked}; None where the threads are not slimrl's to change
_WATCH = ProcessValue("thread_watch", None, "torch threads slimrl manages between steps (slimrl.machine)")
RECHECK_SECONDS = 10.0


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def other_running_jobs(samples: int = 5, interval: float = 0.05) -> int:
    """Runnable tasks other than this process's, now (median of a few /proc/loadavg readings; 0 where unreadable)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - own_running_threads())
        except (OSError, IndexError, ValueError):
            return 0
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, int(statistics.median(counts)))


def own_running_threads() -> int:
    """This process's threads the kernel counts as runnable now (at least 1: the one asking)."""
    running = 0
    for stat in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
        try:
            with open(stat) as f:
                running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return max(1, running)


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
    """Apply `busy_thread_settings` to `environ` (os.environ, before torch is loaded); the one-line description when
    it changed anything (apply_thread_policy: the policy's one entry)."""
    environ = os.environ if environ is None else environ
    others, cores = other_running_jobs(), usable_cores()
    settings = busy_thread_settings(others, cores, environ)
    environ.update(settings)
    return describe(others, cores, settings) if settings else None


def torch_default_threads() -> int | None:
    """The intra-op thread count torch picks by itself on this machine (OMP_NUM_THREADS / MKL_NUM_THREADS, else its
    physical cores, else its logical processors, as ATen's default does); None where the topology is unreadable."""
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    cores, processors = set(), 0
    for topology in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(f"{topology}/physical_package_id") as f, open(f"{topology}/core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            return None
        processors += 1
    if not processors:
        return None
    return len(cores) if 0 < len(cores) < processors else processors


def _torch_loaded() -> bool:
    return "torch" in sys.modules


def _kept_by_user(environ) -> bool:
    """The user chose: SLIMRL_THREADS=keep, a thread variable, or torch.set_num_threads (torch already loaded)."""
    if environ.get(OPT_OUT_VARIABLE, "").strip().lower() == OPT_OUT_VALUE:
        return True
    if any(name in environ for name in USER_THREAD_VARIABLES):
        return True
    if not _torch_loaded():
        return False
    import torch

    default = torch_default_threads()
    return default is not None and torch.get_num_threads() != default


def _threads_changed(others: int, cores: int, current: int, threads: int) -> str:
    """The one line said when slimrl sets torch's thread count (at set-up or between steps)."""
    return (
        f"{others} other running job(s) on {cores} cores: torch threads {current} -> {threads} "
        f"(torch.set_num_threads or OMP_NUM_THREADS to choose, {OPT_OUT_VARIABLE}={OPT_OUT_VALUE} to keep torch's)"
    )


def _lower_torch_threads(others: int, cores: int) -> str | None:
    """torch already loaded: one thread fewer per running job (at least 1), when that is fewer than it has."""
    import torch

    current, threads = torch.get_num_threads(), max(1, cores - others)
    if others < 1 or threads >= current:
        return None
    torch.set_num_threads(threads)
    return _threads_changed(others, cores, current, threads)


def apply_thread_policy(environ=None) -> str | None:
    """The busy-machine policy, once per process (choice 4), said in one notice; returns that line, or None when
    nothing changed (a quiet machine, the user's own choice, or already applied)."""
    environ = os.environ if environ is None else environ
    if _APPLIED.get():
        return None
    _APPLIED.set(True)
    if _kept_by_user(environ):
        return None
    _WATCH.set({"default": torch_default_threads() or usable_cores(), "threads": None, "last": time.monotonic()})
    if _torch_loaded():
        said = _lower_torch_threads(other_running_jobs(), usable_cores())
    else:
        said = adapt_threads_to_load(environ)
    if _torch_loaded():
        import torch

        _WATCH.get()["threads"] = torch.get_num_threads()
    if said:
        notice(said)
    return said


def recheck_thread_policy(now: float | None = None) -> str | None:
    """Between steps (choice 5): torch's threads for the jobs running now, said in one notice when they change."""
    watch = _WATCH.get()
    now = time.monotonic() if now is None else now
    if watch is None or now - watch["last"] < RECHECK_SECONDS:
        return None
    import torch

    current = torch.get_num_threads()
    if watch["threads"] is not None and current != watch["threads"]:  # the user set a count: theirs from now on
        _WATCH.set(None)
        return None
    others, cores = other_running_jobs(samples=3, interval=0.02), usable_cores()
    wanted = min(watch["default"], max(1, cores - others))
    watch.update(threads=wanted, last=now)
    if wanted == current:
        return None
    torch.set_num_threads(wanted)
    said = _threads_changed(others, cores, current, wanted)
    notice(said)
    return said
