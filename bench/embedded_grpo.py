"""Run the bare default `slimrl grpo` (embedded SmolLM2-135M, arithmetic task) and report accuracy and wall time.

Usage: python bench/embedded_grpo.py [--threads N] [--output_dir DIR] [-- extra slimrl grpo flags]
       python bench/embedded_grpo.py --spread [--seeds 1 2 3] [--precisions float32 bfloat16] [--thread_counts 1 2]
       python bench/embedded_grpo.py --merge PART.json [PART.json ...] --json OUT.json [--note TEXT]
The command runs in a subprocess (exactly what a user types), with OMP/MKL threads pinned (default 1: the machine may
be shared; use 2 on an idle 2-core box). Prints the reward curve summary from metrics.jsonl and eval.json, and
writes bench/results/embedded_grpo.json.

`--spread` runs the same command once per (precision, threads, seed), one after another (each run has the machine to
itself), and writes the list `runs` (seed, precision, threads, cpu, accuracy_before, accuracy_after, wall_s) with the
worst and best held-out accuracy after training and the longest wall time: the main job's result on other CPUs'
rounding (threads, bf16) and other draws (seed).

`--merge` joins several `--spread` results files into one (for example one-thread parts run at the same time, each
pinned to a core of its own): their runs in one list, the worst, best and longest taken over all of them, and each
part's provenance kept beside a note on how the parts ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import provenance, results_path, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(command: list[str], threads: int) -> tuple[int, float]:
    """`python -m slimrl.cli COMMAND...` in a subprocess (what a user types), threads pinned; (exit code, wall s)."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "slimrl.cli", *command]
    print("$ python -m slimrl.cli", " ".join(command), flush=True)  # the interpreter's path is this machine's
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"slimrl {command[0]} failed with exit code {proc.returncode} after {wall:.0f} s")
    return proc.returncode, wall


def mean_of(rows: list[dict], key: str) -> float | None:
    """The mean of `key` over the rows that hold a number for it, to 3 decimals (None if none does)."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return round(sum(values) / len(values), 3) if values else None


def summarize(out: str) -> dict:
    """Accuracy before/after from eval.json; the rewards over the first and last steps from metrics.jsonl."""
    with open(os.path.join(out, "eval.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "reward" in r]
    k = max(1, min(5, len(steps) // 2))
    result = {
        "train_seconds": summary.get("train_seconds"),
        "steps": len(steps),
        "accuracy_before": summary.get("accuracy_before"),
        "accuracy_after": summary.get("accuracy_after"),
        "eval_n": (summary.get("eval_after") or {}).get("n"),
    }
    for name, key in (
        ("reward", "reward"),
        ("format", "rewards/format_reward/mean"),
        ("correct", "rewards/correctness_reward/mean"),
        ("closeness", "rewards/closeness_reward/mean"),
    ):
        result[f"{name}_first_steps"] = mean_of(steps[:k], key)
        result[f"{name}_last_steps"] = mean_of(steps[-k:], key)
    result["seconds_per_step"] = (
        round(summary["train_seconds"] / max(1, len(steps)), 1) if summary.get("train_seconds") else None
    )
    result.update(kl_last=steps[-1].get("kl") if steps else None, steps_averaged=k)
    return result


def run_and_summarize(command_name: str, summarize_output) -> tuple[str, dict] | int:
    """The bench's command line: run `slimrl COMMAND_NAME` as a user types it and print its summary (what
    `summarize_output(output folder)` returns, with the command, threads and wall time). Returns (the results file,
    the summary) for the caller's write_results, or the command's exit code when it failed."""
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS / MKL_NUM_THREADS for the run")
    parser.add_argument("--output_dir", default=f"outputs/bench-embedded-{command_name}")
    parser.add_argument("--json", default=results_path(f"embedded_{command_name}"), help="the results file")
    parser.add_argument("extra", nargs="*", help=f"extra flags for slimrl {command_name} (after --)")
    args = parser.parse_args()
    command = [command_name, "--output_dir", args.output_dir, *args.extra]
    returncode, wall = run_cli(command, args.threads)
    if returncode != 0:
        return returncode
    result = {
        "command": "python -m slimrl.cli " + " ".join(command),
        "threads": args.threads,
        "wall_seconds": round(wall, 1),
        **summarize_output(os.path.join(ROOT, args.output_dir)),
    }
    print(json.dumps(result, indent=2))
    return args.json, result


def spread_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--spread", action="store_true", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"], help="--dtype of each run")
    parser.add_argument("--thread_counts", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--output_dir", default="outputs/bench-embedded-grpo-spread")
    parser.add_argument("--json", default=results_path("embedded_grpo"), help="the results file")
    parser.add_argument("extra", nargs="*", help="extra flags for slimrl grpo (after --)")
    return parser.parse_args(argv)


def one_run(args: argparse.Namespace, precision: str, threads: int, seed: int) -> dict:
    """One bare `slimrl grpo` with this precision, thread count and seed: the row of `runs`."""
    out = os.path.join(args.output_dir, f"{precision}-t{threads}-s{seed}")
    command = ["grpo", "--output_dir", out, "--dtype", precision, "--seed", str(seed), *args.extra]
    returncode, wall = run_cli(command, threads)
    row = {"seed": seed, "precision": precision, "threads": threads, "cpu": provenance()["machine"]["cpu"]}
    row.update(command="python -m slimrl.cli " + " ".join(command), returncode=returncode, wall_s=round(wall, 1))
    if returncode == 0:
        summary = summarize(os.path.join(ROOT, out))
        row.update(accuracy_before=summary["accuracy_before"], accuracy_after=summary["accuracy_after"])
        row.update(train_seconds=summary["train_seconds"], steps=summary["steps"], eval_n=summary["eval_n"])
    print(json.dumps(row), flush=True)
    return row


def spread_summary(runs: list[dict]) -> dict:
    """The results of a list of runs: the runs, how many failed, and the worst / best accuracy over those that
    finished and the longest wall time over all."""
    done = [r for r in runs if r["returncode"] == 0]
    return {
        "runs": runs,
        "failed": len(runs) - len(done),
        "worst_accuracy_after": min((r["accuracy_after"] for r in done), default=None),
        "best_accuracy_after": max((r["accuracy_after"] for r in done), default=None),
        "longest_wall_s": max((r["wall_s"] for r in runs), default=None),
    }


def report(path: str, result: dict) -> int:
    """Print the summary, write the results file; 0 only when there were runs and every one finished."""
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "parts")}, indent=2))
    write_results(path, result)
    return 0 if result["runs"] and not result["failed"] else 1


def spread(argv: list[str]) -> int:
    """Every (precision, threads, seed) of the command line, one run each; the results file holds them all."""
    args = spread_arguments(argv)
    runs = [
        one_run(args, precision, threads, seed)
        for precision in args.precisions
        for threads in args.thread_counts
        for seed in args.seeds
    ]
    return report(args.json, spread_summary(runs))


def merge(argv: list[str]) -> int:
    """Several --spread results files as one: every part's runs, the summary over all, each part's provenance."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--merge", action="store_true", required=True)
    parser.add_argument("parts", nargs="+", help="--spread results files")
    parser.add_argument("--json", required=True, help="the joined results file")
    parser.add_argument("--note", default="", help="how the parts ran (for example: at the same time, one per core)")
    args = parser.parse_args(argv)
    runs, parts = [], []
    for path in args.parts:
        with open(path) as f:
            data = json.load(f)
        runs += data["runs"]
        parts.append({"file": os.path.basename(path), "provenance": data["provenance"]})
    return report(args.json, {**spread_summary(runs), "parts": parts, "note": args.note})


def main() -> int:
    if "--spread" in sys.argv[1:]:
        return spread(sys.argv[1:])
    if "--merge" in sys.argv[1:]:
        return merge(sys.argv[1:])
    done = run_and_summarize("grpo", summarize)
    if isinstance(done, int):
        return done
    write_results(*done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
