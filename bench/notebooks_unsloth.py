"""Unsloth's own notebooks of the notebooks tier (tests/notebooks/unsloth/), each timed alone and beside one other
CPU job: a notebook user's machine is often running something else.

    python bench/notebooks_unsloth.py                                     # plain, in this interpreter
    .venv-vllm/bin/python bench/notebooks_unsloth.py --vllm               # the vLLM half
    python bench/notebooks_unsloth.py --settings alone                    # one setting only

Choices:
1. A run is the tier's own test (tests/notebooks/test_unsloth_notebooks.py): each notebook rewritten as a user
   would, run in its own process with patching on import, checked to get where it must; the test records each
   wall time (model load and every cell included).
2. The notebooks keep torch's own thread choice (no OMP_NUM_THREADS: SLIMRL_NOTEBOOKS_THREADS=torch), as in a
   user's notebook, so slimrl's busy-machine thread policy is part of what is timed.
3. "alone": nothing else runs. "beside": the bare `slimrl grpo` (the main job, with the command's own thread choice
   and a step cap no run reaches) starts first and runs the whole time; it is stopped after the last notebook.
4. The limits a notebook must stay within: LIMITS (each row says whether it did).
Results: bench/results/notebooks_unsloth_timed.json (rows: notebook, setting, ends, wall_s, limit_s, within_limit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import results_path, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIER_TEST = os.path.join("tests", "notebooks", "test_unsloth_notebooks.py")
LIMITS = {"alone": 300, "beside": 900}  # seconds per notebook


def other_job(output_dir: str) -> subprocess.Popen:
    """The main job as one other CPU-heavy process (its own thread choice: no OMP_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "slimrl.cli", "grpo", "--output_dir", output_dir, "--max_steps", "100000"]
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tier_rows(vllm: bool, results: str) -> tuple[int, list[dict]]:
    """The tier's test for one half (plain or vLLM); its exit code and the rows it recorded."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(SLIMRL_NOTEBOOKS_THREADS="torch", SLIMRL_NOTEBOOKS_RESULTS=results, HF_HUB_OFFLINE="1")
    select = "vllm" if vllm else "not vllm"
    command = [sys.executable, "-m", "pytest", "-q", "-rP", "-m", "notebooks", "-k", select, "-p", "no:cacheprovider"]
    code = subprocess.run([*command, TIER_TEST], env=env, cwd=ROOT).returncode
    rows = json.loads(open(results).read())["rows"] if os.path.exists(results) else []
    return code, rows


def timed(setting: str, vllm: bool) -> tuple[int, list[dict]]:
    """Every notebook of the half in one setting: the rows, each with the setting and its limit."""
    with tempfile.TemporaryDirectory(prefix="notebooks-") as scratch:
        other = other_job(os.path.join(scratch, "other")) if setting == "beside" else None
        try:
            time.sleep(20 if other else 0)  # the other job past its start-up, into its work
            code, rows = tier_rows(vllm, os.path.join(scratch, "rows.json"))
            running = other is None or other.poll() is None
        finally:
            if other:
                other.terminate()
                other.wait()
    if not running:
        print("the other job ended before the notebooks did: the setting did not hold", file=sys.stderr)
        code = code or 1
    return code, [limited(row, setting) for row in rows]


def limited(row: dict, setting: str) -> dict:
    """A tier row with its setting, the limit it must stay within and whether it did."""
    limit = LIMITS[setting]
    return {**row, "setting": setting, "limit_s": limit, "within_limit": row["wall_s"] <= limit}


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--vllm", action="store_true", help="the tier's vLLM half (run this in .venv-vllm)")
    parser.add_argument("--settings", nargs="+", choices=sorted(LIMITS), default=["alone", "beside"])
    parser.add_argument("--json", default=results_path("notebooks_unsloth_timed"))
    args = parser.parse_args()
    codes, rows = [], []
    for setting in args.settings:
        code, found = timed(setting, args.vllm)
        codes.append(code)
        rows += found
    for row in rows:
        print(f"{row['setting']:>6}  {row['notebook']}: {row['ends']} in {row['wall_s']} s (limit {row['limit_s']} s)")
    write_results(args.json, rows)
    return 0 if not any(codes) and rows and all(r["within_limit"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
