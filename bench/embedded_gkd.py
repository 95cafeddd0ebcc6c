"""Distil a GRPO-trained teacher into a fresh student on the embedded SmolLM2-135M and report held-out accuracies.

Usage: python bench/embedded_gkd.py [--threads N] [--teacher_adapter DIR] [--output_dir DIR] [-- extra slimrl gkd flags]
1. The teacher: the embedded model plus the adapter the bare `slimrl grpo` trains (run here into OUTPUT_DIR/teacher,
   unless --teacher_adapter names one made earlier by `slimrl grpo`).
2. The student: `slimrl gkd --teacher_adapter TEACHER --lmbda 1`, a fresh LoRA trained only on its own samples scored
   by the teacher (no ground-truth answer reaches it), with greedy held-out accuracy before, after, and the teacher's
   on the same 128 prompts. The nightly test tests/cli/test_embedded_gkd_nightly.py runs the same two commands.
Writes bench/results/embedded_gkd.json.
"""

from __future__ import annotations

import argparse
import json
import os

from embedded_grpo import ROOT, run_cli

from _common import results_path, write_results


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS / MKL_NUM_THREADS for each run")
    parser.add_argument("--output_dir", default="outputs/bench-embedded-gkd")
    parser.add_argument("--teacher_adapter", help="an adapter folder from `slimrl grpo` (else trained here first)")
    parser.add_argument("--json", default=results_path("embedded_gkd"), help="the results file")
    parser.add_argument("extra", nargs="*", help="extra flags for slimrl gkd (after --)")
    args = parser.parse_args()
    teacher, teacher_wall = args.teacher_adapter, None
    if teacher is None:
        teacher = os.path.join(args.output_dir, "teacher")
        returncode, teacher_wall = run_cli(["grpo", "--output_dir", teacher, "--num_eval_samples", "0"], args.threads)
        if returncode != 0:
            return returncode
    student = os.path.join(args.output_dir, "student")
    command = ["gkd", "--teacher_adapter", teacher, "--lmbda", "1", "--output_dir", student, *args.extra]
    returncode, wall = run_cli(command, args.threads)
    if returncode != 0:
        return returncode
    with open(os.path.join(ROOT, student, "eval.json")) as f:
        summary = json.load(f)
    with open(os.path.join(ROOT, student, "metrics.jsonl")) as f:
        losses = [row["loss"] for row in map(json.loads, filter(str.strip, f)) if "loss" in row]
    result = {
        "command": "python -m slimrl.cli " + " ".join(command),
        "teacher": "given: " + teacher if args.teacher_adapter else "trained here by the bare slimrl grpo",
        "teacher_wall_seconds": None if teacher_wall is None else round(teacher_wall, 1),
        "threads": args.threads,
        "wall_seconds": round(wall, 1),
        "train_seconds": summary.get("train_seconds"),
        "steps": len(losses),
        "accuracy_before": summary.get("accuracy_before"),
        "accuracy_after": summary.get("accuracy_after"),
        "accuracy_teacher": summary.get("accuracy_teacher"),
        "eval_n": (summary.get("eval_after") or {}).get("n"),
        "loss_first_steps": round(sum(losses[:5]) / max(1, len(losses[:5])), 4) if losses else None,
        "loss_last_steps": round(sum(losses[-5:]) / max(1, len(losses[-5:])), 4) if losses else None,
    }
    print(json.dumps(result, indent=2))
    write_results(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
