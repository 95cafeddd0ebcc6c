"""Stock TRL vs slimrl on a GPU (issue 18): GRPO with LoRA on random-weight Qwen2.5-1.5B and 7B ("8B-class") models in
bf16, V=152k: peak memory and s/step at 8 x 2K and 8 x 8K completion tokens with slimrl's offload off and on; the
longest completion that fits for each arm; DPO / ORPO at 2 x 4K. Every arm of every configuration, and every probe of
the search, runs in its own process (this script re-invoked with --child). Arms, models, rollouts: bench/_gpu_arms.py.

    PYTHONPATH=src python bench/gpu_memory.py --smoke                      # CPU, toy model, every code path
                                                    (15 processes of ~7 s each on a quiet CPU, mostly imports)
    PYTHONPATH=src python bench/gpu_memory.py --only grpo --models 8b --json $OUT/grpo_8b.json
    python bench/gpu_memory.py --report a.json b.json                      # one markdown table from several runs

Device budget: one command may run 10 minutes, a session has 30 minutes of device time. The full run does not fit in
one command, so it is split; each call writes its rows to its --json file as they come (partial results survive a
killed command) and prints its table; `--report` joins the files. Estimates for an H100 (not measured: weights,
FLOP counts at ~400 TFLOP/s, ~20 s of imports and model build per process):
  1. bash scripts/test_gpu.sh                                                   4-6 min
  2. --only grpo --models 8b --lengths 8192 2048            (6 processes)      4-6 min   the targets' row
  3. --only bisect --models 8b --arms stock slimrl --guess-from <2's json>      4-6 min
  4. --only bisect --models 8b --arms slimrl-offload --guess-from <2's json>    5-8 min   (probes of 30-45K tokens)
  5. --only grpo pref --models 1.5b                         (14 processes)     5-7 min
  6. --only pref --models 8b                                (4 processes)      3-4 min
Calls 1-4 (~20-26 min with machine starts) are what the targets need; 5-6 complete the table when time is left.

Choices:
* Ratios are taken against the stock arm of the same (model, length, rows, rollouts). Targets (issue 18, 8B-class,
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, run_self  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("grpo", "bisect", "pref")
SMOKE = dict(models=["smoke"], lengths=[16], pref_length=64, start=16, resolution=16, maximum=32, steps=2)


def longest_fit(probe, start: int, resolution: int, maximum: int, step: int | None = None) -> dict:
    """Largest multiple of `resolution` <= `maximum` for which `probe(length)` is true, assuming monotonicity.

    Gallops from `start` (steps `step`, doubling; default `start`, i.e. doubling lengths) until the answer is
    bracketed, then bisects. Returns the longest fit (None if nothing down to `resolution` fits), the first failing
    length (None if `maximum` fits) and every probe in order."""
    results: dict[int, bool] = {}

    def fits(length: int) -> bool:
        if length not in results:
            results[length] = bool(probe(length))
        return results[length]

    step = step or start
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
    return {"longest": lo, "first_failure": hi, "probes": list(results.items())}


def guess_longest(rows: list[dict], model: str, arm: str, resolution: int) -> int | None:
    """Length where a linear fit of the reserved peak (GRPO rows of `model`/`arm`) reaches the GPU's memory."""
    points = sorted({(r["length"], r["reserved"]) for r in rows if r.get("kind") == "grpo" and r["model"] == model
                     and r["arm"] == arm and not r.get("oom") and r.get("reserved") and "error" not in r})
    if len(points) < 2:
        return None
    (l0, p0), (l1, p1) = points[0], points[-1]
    slope = (p1 - p0) / (l1 - l0)
    total = next(r["device_total"] for r in rows if r.get("device_total"))
    if slope <= 0:
        return None
    return max(resolution, int((total - p0) / slope + l0) // resolution * resolution)


def run_child(args: list[str], threads: int, timeout: float) -> dict:
    try:
        return run_self(args, threads, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}


def save(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


def run_parts(a) -> list[dict]:
    rows: list[dict] = []
    known = [r for path in a.guess_from for r in json.load(open(path))["rows"]]
    common = ["--threads", str(a.threads), "--device", a.device]

    def add(row: dict) -> dict:
        rows.append(row)
        save(rows, a.json)
        print(json.dumps({k: v for k, v in row.items() if k != "probes"}), file=sys.stderr, flush=True)
        return row

    for model in a.models:
        if "grpo" in a.only:
            for length in a.lengths:
                for arm in a.arms:
                    base = {"kind": "grpo", "arm": arm, "model": model, "length": length, "rows": a.rows,
                            "rollouts": a.rollouts}
                    add(dict(base, **run_child(["--child", "grpo", "--arm", arm, "--model", model, "--length",
                                                str(length), "--rows", str(a.rows), "--steps", str(a.steps),
                                                "--rollouts", a.rollouts, *common], a.threads, a.timeout)))
        if "bisect" in a.only:
            for arm in a.arms:
                add(bisect_arm(a, model, arm, known + rows, common))
        if "pref" in a.only:
            for trainer in a.pref_trainers:
                for arm in a.arms:
                    base = {"kind": "pref", "arm": arm, "trainer": trainer, "model": model,
                            "length": a.pref_length, "rows": a.pref_pairs}
                    add(dict(base, **run_child(["--child", "pref", "--arm", arm, "--trainer", trainer, "--model",
                                                model, "--length", str(a.pref_length), "--rows",
                                                str(a.pref_pairs), "--steps", str(a.steps), *common],
                                               a.threads, a.timeout)))
    return rows


def bisect_arm(a, model: str, arm: str, known: list[dict], common: list[str]) -> dict:
    outcomes: dict[int, dict] = {}

    def probe(length: int) -> bool:
        out = run_child(["--child", "grpo", "--arm", arm, "--model", model, "--length", str(length), "--rows",
                         str(a.rows), "--steps", "1", "--rollouts", "synthetic", *common], a.threads, a.timeout)
        outcomes[length] = out
        print(f"[probe {model} {arm} {length}] " + ("OOM" if out.get("oom") else out.get("error", "fits")[:300]),
              file=sys.stderr, flush=True)
        return not out.get("oom") and "error" not in out

    guess = guess_longest(known, model, arm, a.resolution)
    start = min(guess or a.start, a.maximum)
    found = longest_fit(probe, start, a.resolution, a.maximum, step=a.resolution if guess else None)
    failure = outcomes.get(found["first_failure"], {})
    reason = "OOM" if failure.get("oom") else failure.get("error", "")[:200] or None
    env = next((o for o in outcomes.values() if "device" in o), {})
    return {"kind": "bisect", "arm": arm, "model": model, "rows": a.rows, "guess": guess, **found,
            "failure_reason": reason, **{k: env.get(k) for k in ("device", "torch", "transformers", "trl")}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--models", nargs="+", default=["1.5b", "8b"], help="1.5b, 8b (smoke: the CPU toy)")
    p.add_argument("--arms", nargs="+", default=["stock", "slimrl", "slimrl-offload"],
                   help="stock, slimrl, slimrl-offload, stock-offload (transformers' own offload)")
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
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--smoke", action="store_true", help=f"CPU, toy model, seconds: {SMOKE}")
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "gpu_memory.json"))
    p.add_argument("--report", nargs="+", help="print the table of these JSON files and exit")
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
        print(render([r for path in a.report for r in json.load(open(path))["rows"]]))
        return 0
    if a.smoke:
        a.device, a.models, a.lengths, a.pref_length = "cpu", SMOKE["models"], SMOKE["lengths"], SMOKE["pref_length"]
        a.start, a.resolution, a.maximum, a.steps = SMOKE["start"], SMOKE["resolution"], SMOKE["maximum"], 2
        a.threads = min(a.threads, 1)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(render(run_parts(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
