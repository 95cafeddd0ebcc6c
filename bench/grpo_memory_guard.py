"""The memory-regression guard: one GRPO step's working memory under slimrl, measured now, against the committed figure.

    PYTHONPATH=src python bench/grpo_memory_guard.py                      # exit 0: within 10% of the committed figure
    PYTHONPATH=src python bench/grpo_memory_guard.py --control-buffer     # the negative control: must exit 1

Choices:
* The run is bench/grpo_memory.py's slimrl arm (`--child slimrl`, its own process, 1 thread) at the vocabulary and
  completion length of the committed file's first row (bench/results/committed/grpo_memory_repeatable.json: V=152,064,
  completion 512, G=8, LoRA, fp32 CPU), for `--steps` steps (default 1: the first step is the largest, see the
  committed `working_steps`), and its "working" (peak minus RSS from the policy forward to the end of its backward) is
  compared with the committed slimrl "working". Only memory: working memory is the same from one machine to the next,
  the time is not.
* Fails (exit 1) when the figure grows by more than `--tolerance` (10%); a figure that shrank passes and says so (the
  committed file is then due for a refresh).
* `--control-buffer` makes the step hold an extra written [completion, vocab] fp32 buffer (311 MiB at this size)
  across the backward: a deliberate regression the guard must catch (tests/bench/test_grpo_memory_guard.py, slow tier).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import results_path, write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "bench", "results", "committed", "grpo_memory_repeatable.json")
MiB = 1024**2


def committed_figure(path: str) -> dict:
    """vocab, completion and slimrl's working bytes of the committed file's first row."""
    with open(path) as f:
        row = json.load(f)["rows"][0]
    return {"vocab": row["vocab"], "completion": row["completion"], "working": row["slimrl"]["working"]}


def verdict(measured: int, committed: int, tolerance: float) -> tuple[bool, str]:
    """(passes, one line): whether `measured` is within `tolerance` (a fraction) above `committed`."""
    if measured <= 0 or committed <= 0:
        raise ValueError(f"working memory must be positive: measured {measured}, committed {committed}")
    ratio = measured / committed
    line = f"working memory {measured / MiB:.1f} MiB vs committed {committed / MiB:.1f} MiB ({ratio:.3f}x"
    if ratio > 1 + tolerance:
        return False, f"REGRESSION: {line}, over the {tolerance:.0%} allowed)"
    if ratio < 1 - tolerance:
        return True, f"ok: {line}; lower by more than {tolerance:.0%}: the committed figure is due for a refresh)"
    return True, f"ok: {line}, within {tolerance:.0%})"


def measure(vocab: int, completion: int, steps: int, threads: int, control_buffer: bool) -> dict:
    """bench/grpo_memory.py's slimrl arm in its own process; its JSON line."""
    cmd = [sys.executable, os.path.join(ROOT, "bench", "grpo_memory.py"), "--child", "slimrl", "--vocab", str(vocab)]
    cmd += ["--completion", str(completion), "--steps", str(steps), "--threads", str(threads), "--device", "cpu"]
    cmd += ["--control-buffer"] if control_buffer else []
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"the measured run exited {proc.returncode}: {(proc.stderr or proc.stdout)[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--committed", default=COMMITTED, help="the committed results file of bench/grpo_memory.py")
    p.add_argument("--tolerance", type=float, default=0.10, help="growth allowed, a fraction (default 0.10)")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--control-buffer", action="store_true", help="the negative control: an extra [T, V] buffer")
    p.add_argument("--json", default=results_path("grpo_memory_guard"), help="the results file: verdict, both figures")
    a = p.parse_args(argv)
    if not 0 < a.tolerance < 1 or a.steps < 1 or a.threads < 1:
        p.error("--tolerance must be in (0, 1), --steps and --threads at least 1")
    ref = committed_figure(a.committed)
    run = measure(ref["vocab"], ref["completion"], a.steps, a.threads, a.control_buffer)
    ok, line = verdict(run["working"], ref["working"], a.tolerance)
    control = ", with the control buffer" if a.control_buffer else ""
    print(f"# GRPO step, V={ref['vocab']}, completion {ref['completion']}, {a.steps} step(s){control}: {line}")
    result = {"passes": ok, "measured": run["working"], "committed": ref["working"], **run}
    print(json.dumps(result))
    write_results(a.json, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
