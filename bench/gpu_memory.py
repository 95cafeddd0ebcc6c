"""Stock TRL vs slimrl on a GPU: GRPO with LoRA on random-weight Qwen2.5-1.5B and 7B ("8B-class") models in
bf16, V=152k: peak memory and s/step at 8 x 2K and 8 x 8K completion tokens with slimrl's offload off and on; the
longest completion that fits for each arm; DPO / ORPO at 2 x 4K. Every arm of every configuration, and every probe of
the search, runs in its own process (this script re-invoked with --child). Arms, models, rollouts: bench/_gpu_arms.py.

    PYTHONPATH=src python bench/gpu_memory.py --smoke                      # CPU, toy model, every code path
                                                    (15 processes of ~7 s each on a quiet CPU, mostly imports)
    PYTHONPATH=src python bench/gpu_memory.py --only grpo --models 8b --json bench/results/grpo_8b.json
    python bench/gpu_memory.py --report a.json b.json                      # one markdown table from several runs

The full run can be split into several commands (the order: docs/gpu-and-benchmarks.md). Each command writes its
rows to its --json file as they come (a killed command keeps what it finished), no child starts that would not end
before --deadline (570 s), and `--report` joins the files into one table. Estimates for an H100 (not measured: FLOP
counts at ~400 TFLOP/s and ~20 s of imports and model build per process):
  1. bash scripts/test_gpu.sh                                                        4-6 min
  2. --only grpo --models 8b --lengths 8192 2048                    (6 processes)   4-6 min  the targets' rows
  3. --only bisect --models 8b --arms stock --guess-from <2's json>  (3-5 probes)   3-6 min
  4. --only bisect --models 8b --arms slimrl-offload --resolution 2048 --guess-from <2's json>   5-9 min
  5. --only pref --models 8b --arms stock slimrl                    (4 processes)   2-4 min
  6. --only grpo pref --models 1.5b                                 (12 processes)  5-7 min
Steps 1-4 (~20-27 min) give the headline rows; 5-6 complete the table.

Choices:
* Ratios are taken against the stock arm of the same (model, length, rows, rollouts). Targets (8B-class,
  8 x 8K, offload on): GRPO peak <= 0.5x stock, s/step <= 1.05x stock, longest completion that fits >= 3x stock's.
* Longest completion that fits: galloping search then bisection on multiples of --resolution; each probe is one
  training step (synthetic rollouts) in a fresh process; a probe "fits" when it finishes without error. OOM and other
  errors (e.g. pinned host memory running out in offload mode) are told apart in the table. --guess-from: GRPO rows
  measured at two or more lengths give a linear fit of the reserved peak, and the search starts at the length where
  it reaches the GPU's memory (a few probes instead of ten).
* PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in every arm (set unless already set): less fragmentation for
  long sequences, the same allocator for both arms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, run_self, write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("grpo", "bisect", "pref")
SMOKE = dict(models=["smoke"], lengths=[16], pref_length=64, start=16, resolution=16, maximum=32, steps=2)


def longest_fit(probe, start: int, resolution: int, maximum: int, step: int | None = None) -> dict:
    """Largest multiple of `resolution` <= `maximum` for which `probe(length)` is true, assuming monotonicity.

    Gallops from `start` (steps `step`, doubling; default `start`, i.e. doubling lengths) until the answer is
    bracketed, then bisects. Returns the longest fit (None if nothing down to `resolution` fits), the first failing
    length (None if `maximum` fits) and every probe in order. A probe returning None stops the search: the result is
    then the bracket found so far, marked `stopped`."""
    results: dict[int, bool] = {}

    def fits(length: int) -> bool:
        if length not in results:
            ok = probe(length)
            if ok is None:  # the prober ran out of time: report the bracket found so far
                raise _Stopped
            results[length] = bool(ok)
        return results[length]

    try:
        lo, hi = _search(fits, start, resolution, maximum, step or start)
    except _Stopped:
        lo = max((n for n, ok in results.items() if ok), default=None)
        hi = min((n for n, ok in results.items() if not ok), default=None)
        return {"longest": lo, "first_failure": hi, "probes": list(results.items()), "stopped": True}
    return {"longest": lo, "first_failure": hi, "probes": list(results.items()), "stopped": False}


class _Stopped(Exception):
    pass


def _search(fits, start: int, resolution: int, maximum: int, step: int) -> tuple[int | None, int | None]:
    lo = hi = None
    if fits(start):
        lo = start
        while lo < maximum and hi is None:
            length = min(lo + step, maximum)
            lo, hi = (length, None) if fits(length) else (lo, length)
            step *= 2
    else:
        hi = start
        while lo is None and hi > resolution:
            length = max(hi - step, resolution)
            lo, hi = (length, hi) if fits(length) else (None, length)
            step *= 2
    while lo is not None and hi is not None and hi - lo > resolution:
        mid = lo + (hi - lo) // 2 // resolution * resolution
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, hi


def guess_longest(rows: list[dict], model: str, arm: str, resolution: int) -> int | None:
    """Length where a linear fit of the reserved peak (GRPO rows of `model`/`arm`) reaches the GPU's memory."""
    points = sorted(
        {
            (r["length"], r["reserved"])
            for r in rows
            if r.get("kind") == "grpo"
            and r["model"] == model
            and r["arm"] == arm
            and not r.get("oom")
            and r.get("reserved")
            and "error" not in r
        }
    )
    if len(points) < 2:
        return None
    (l0, p0), (l1, p1) = points[0], points[-1]
    slope = (p1 - p0) / (l1 - l0)
    total = next(r["device_total"] for r in rows if r.get("device_total"))
    if slope <= 0:
        return None
    return max(resolution, int((total - p0) / slope + l0) // resolution * resolution)


class Clock:
    """The command's time limit: a child starts only if the last child's duration still fits before the deadline."""

    def __init__(self, seconds: float):
        self.end, self.last = time.monotonic() + seconds, 0.0

    def run(self, args: list[str], threads: int, timeout: float) -> dict | None:
        left = self.end - time.monotonic()
        if left < max(self.last, 30.0):
            return None
        began = time.monotonic()
        try:
            out = run_self(args, threads, timeout=min(timeout, left))
        except subprocess.TimeoutExpired:
            out = {"error": f"timeout after {min(timeout, left):.0f} s"}
        self.last = time.monotonic() - began
        return out


SKIPPED = {"error": "skipped: no time left before --deadline"}


def save(rows: list[dict], path: str) -> None:
    write_results(path, rows)


def run_parts(a) -> list[dict]:
    rows: list[dict] = []
    clock = Clock(a.deadline)
    known = [r for path in a.guess_from for r in json.load(open(path))["rows"]]
    common = ["--threads", str(a.threads), "--device", a.device]

    def add(row: dict) -> dict:
        rows.append(row)
        save(rows, a.json)
        print(json.dumps({k: v for k, v in row.items() if k != "probes"})[:600], file=sys.stderr, flush=True)
        return row

    for model in a.models:
        if "grpo" in a.only:
            for length in a.lengths:
                for arm in a.arms:
                    base = {
                        "kind": "grpo",
                        "arm": arm,
                        "model": model,
                        "length": length,
                        "rows": a.rows,
                        "rollouts": a.rollouts,
                    }
                    add(
                        dict(
                            base,
                            **(
                                clock.run(
                                    [
                                        "--child",
                                        "grpo",
                                        "--arm",
                                        arm,
                                        "--model",
                                        model,
                                        "--length",
                                        str(length),
                                        "--rows",
                                        str(a.rows),
                                        "--steps",
                                        str(a.steps),
                                        "--rollouts",
                                        a.rollouts,
                                        *common,
                                    ],
                                    a.threads,
                                    a.timeout,
                                )
                                or SKIPPED
                            ),
                        )
                    )
        if "bisect" in a.only:
            for arm in a.arms:
                add(bisect_arm(a, model, arm, known + rows, common, clock, add))
        if "pref" in a.only:
            for trainer in a.pref_trainers:
                for arm in a.arms:
                    base = {
                        "kind": "pref",
                        "arm": arm,
                        "trainer": trainer,
                        "model": model,
                        "length": a.pref_length,
                        "rows": a.pref_pairs,
                    }
                    add(
                        dict(
                            base,
                            **(
                                clock.run(
                                    [
                                        "--child",
                                        "pref",
                                        "--arm",
                                        arm,
                                        "--trainer",
                                        trainer,
                                        "--model",
                                        model,
                                        "--length",
                                        str(a.pref_length),
                                        "--rows",
                                        str(a.pref_pairs),
                                        "--steps",
                                        str(a.steps),
                                        *common,
                                    ],
                                    a.threads,
                                    a.timeout,
                                )
                                or SKIPPED
                            ),
                        )
                    )
    return rows


def bisect_arm(a, model: str, arm: str, known: list[dict], common: list[str], clock: Clock, add) -> dict:
    outcomes: dict[int, dict] = {}

    def probe(length: int) -> bool | None:
        out = clock.run(
            [
                "--child",
                "grpo",
                "--arm",
                arm,
                "--model",
                model,
                "--length",
                str(length),
                "--rows",
                str(a.rows),
                "--steps",
                "1",
                "--rollouts",
                "synthetic",
                *common,
            ],
            a.threads,
            a.timeout,
        )
        if out is None:
            return None
        outcomes[length] = out
        add({**out, "kind": "probe", "arm": arm, "model": model, "length": length})  # kept if the command is killed
        return not out.get("oom") and "error" not in out

    guess = guess_longest(known, model, arm, a.resolution)
    start = min(guess or a.start, a.maximum)
    found = longest_fit(probe, start, a.resolution, a.maximum, step=a.resolution if guess else None)
    failure = outcomes.get(found["first_failure"], {})
    reason = "OOM" if failure.get("oom") else failure.get("error", "")[:200] or None
    env = next((o for o in outcomes.values() if "device" in o), {})
    return {
        "kind": "bisect",
        "arm": arm,
        "model": model,
        "rows": a.rows,
        "guess": guess,
        **found,
        "failure_reason": reason,
        **{k: env.get(k) for k in ("device", "torch", "transformers", "trl")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--models", nargs="+", default=["1.5b", "8b"], help="1.5b, 8b (smoke: the CPU toy)")
    p.add_argument(
        "--arms",
        nargs="+",
        default=["stock", "slimrl", "slimrl-offload"],
        help="stock, slimrl, slimrl-offload, stock-offload (transformers' own offload)",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192], help="GRPO completion tokens")
    p.add_argument("--rows", type=int, default=8, help="GRPO completions per step (one prompt, G = rows)")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps; s/step is the mean after the first")
    p.add_argument("--rollouts", choices=["synthetic", "generate"], default="synthetic")
    p.add_argument("--start", type=int, default=8192, help="first probe of the search without a guess")
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--maximum", type=int, default=65536)
    p.add_argument("--guess-from", nargs="*", default=[], help="JSON files with GRPO rows at two or more lengths")
    p.add_argument("--pref-trainers", nargs="+", default=["dpo", "orpo"])
    p.add_argument("--pref-length", type=int, default=4096)
    p.add_argument("--pref-pairs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=540, help="seconds per child process")
    p.add_argument(
        "--deadline",
        type=float,
        default=570,
        help="seconds for the whole command: no child starts that would not end before it (the device "
        "tool stops a command at 600 s)",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--smoke", action="store_true", help=f"CPU, toy model, seconds: {SMOKE}")
    p.add_argument("--json", help="the results file (default: bench/results/gpu_memory.json, or *_report.json)")
    p.add_argument("--report", nargs="+", help="print the table of these JSON files, write it to --json, and exit")
    p.add_argument("--child", choices=["grpo", "pref"], help=argparse.SUPPRESS)
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--trainer", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        pin_threads(a.threads)
        from _gpu_arms import child_grpo, child_preference

        if a.child == "grpo":
            res = child_grpo(a.arm, a.model, a.length, a.rows, a.steps, a.rollouts, a.device)
        else:
            res = child_preference(a.arm, a.trainer, a.model, a.length, a.rows, a.steps, a.device)
        print(json.dumps(res), flush=True)
        return 0
    from _gpu_report import render

    if a.report:
        parts = {path: json.load(open(path)) for path in a.report}
        rows = [r for part in parts.values() for r in part["rows"]]
        print(render(rows))
        inputs = {path: part.get("provenance") for path, part in parts.items()}
        write_results(a.json or results_path("gpu_memory_report"), {"inputs": inputs, "rows": rows})
        return 0
    a.json = a.json or results_path("gpu_memory")
    if a.smoke:
        a.device, a.models, a.lengths, a.pref_length = "cpu", SMOKE["models"], SMOKE["lengths"], SMOKE["pref_length"]
        a.start, a.resolution, a.maximum, a.steps = SMOKE["start"], SMOKE["resolution"], SMOKE["maximum"], 2
        a.threads, a.deadline = min(a.threads, 1), max(a.deadline, 3600)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(render(run_parts(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
