"""Run the bare default `slimrl ppo` (embedded SmolLM2-135M, arithmetic task) and report accuracy, score and time.

Usage: python bench/embedded_ppo.py [--threads N] [--output_dir DIR] [--json PATH] [-- extra slimrl ppo flags]
The command runs in a subprocess, exactly as a user types it (bench/embedded_grpo.py's `run_and_summarize`).
Reads metrics.jsonl (one row per rollout with `objective/scores`, the sampled correctness, and `objective/kl`) and
eval.json (greedy held-out accuracy before and after), and writes bench/results/embedded_ppo.json.
"""

from __future__ import annotations

import json
import os

from embedded_grpo import mean_of, run_and_summarize

from _common import write_results


def summarize(out: str) -> dict:
    """Accuracy before/after from eval.json; the score over the first and last five rollouts from metrics.jsonl."""
    with open(os.path.join(out, "eval.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rollouts = [row for row in map(json.loads, filter(str.strip, f)) if "objective/scores" in row]
    k = max(1, min(5, len(rollouts) // 2))
    n = (summary.get("eval_after") or {}).get("n")
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    return {
        "train_seconds": summary.get("train_seconds"),
        "rollouts": len(rollouts),
        "accuracy_before": before,
        "accuracy_after": after,
        "eval_n": n,
        "correct_before": round(before * n) if n and before is not None else None,
        "correct_after": round(after * n) if n and after is not None else None,
        "score_first_rollouts": mean_of(rollouts[:k], "objective/scores"),
        "score_last_rollouts": mean_of(rollouts[-k:], "objective/scores"),
        "kl_last": rollouts[-1].get("objective/kl") if rollouts else None,
        "rollouts_averaged": k,
    }


def main() -> int:
    done = run_and_summarize("ppo", summarize)
    if isinstance(done, int):
        return done
    write_results(*done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
