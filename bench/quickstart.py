"""The README's quick start, as written: its held-out accuracy before and after, and its wall and CPU time.

Usage: python bench/quickstart.py [--seeds 42 1 2 3] [--threads N] [--markdown]
Each seed runs the README's quick-start block (the one that calls `trainer.train()`) in a fresh process, the seed
added to its `GRPOConfig` (42 is TRL's default, so `--seeds 42` is the block exactly as written). Wall time and CPU
time (user + system: what other jobs on the machine barely change) are the process's, imports and model load
included; run once first so the embedded model's one-time conversion is not in them. Threads: torch's own unless
--threads (OMP/MKL) is given. Writes bench/results/quickstart.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

from _common import render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
RESULT = re.compile(r"held-out accuracy: ([0-9.]+) -> ([0-9.]+)")


def quick_start_block() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = [b for b in BLOCK.findall(f.read()) if "trainer.train()" in b]
    if len(blocks) != 1:
        raise SystemExit(f"expected one README block that calls trainer.train(), found {len(blocks)}")
    return blocks[0]


def with_seed(block: str, seed: int) -> str:
    if seed == 42:
        return block
    if "args = GRPOConfig(\n" not in block:
        raise SystemExit("the quick start no longer builds `args = GRPOConfig(` on one line: update with_seed")
    return block.replace("args = GRPOConfig(\n", f"args = GRPOConfig(\n    seed={seed},\n", 1)


def run(block: str, threads: int | None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as folder:  # outputs/quickstart lands there, as in a fresh clone
        script = os.path.join(folder, "quickstart.py")
        with open(script, "w") as f:
            f.write(block)
        start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, script], env=env, cwd=folder, capture_output=True, text=True)
        wall, done = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    found = RESULT.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"the quick start failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = done.ru_utime + done.ru_stime - used.ru_utime - used.ru_stime  # what a busy machine does not inflate
    return {
        "before": float(found.group(1)),
        "after": float(found.group(2)),
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--threads", type=int, default=None, help="OMP/MKL threads (unset: torch's default)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "quickstart.json"))
    args = parser.parse_args()
    block = quick_start_block()
    rows = []
    for seed in args.seeds:
        rows.append({"seed": seed, **run(with_seed(block, seed), args.threads)})
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"threads": args.threads, "cpu_count": os.cpu_count(), "rows": rows}, f, indent=1)
    lines = [
        [str(r["seed"]), f"{r['before']:.2f}", f"{r['after']:.2f}", str(r["wall_seconds"]), str(r["cpu_seconds"])]
        for r in rows
    ]
    print(render(["seed", "held-out accuracy before", "after", "wall s", "CPU s"], lines, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
