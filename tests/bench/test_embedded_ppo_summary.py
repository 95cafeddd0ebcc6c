"""bench/embedded_ppo.py's summary of a finished `slimrl ppo` output folder (no run): accuracy and counts from
eval.json, the score over the first and last five rollouts from metrics.jsonl (rows without a score skipped)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

import embedded_ppo  # noqa: E402


def test_summary_of_an_output_folder(tmp_path):
    (tmp_path / "eval.json").write_text(
        json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.5, "eval_after": {"n": 128}, "train_seconds": 9.5})
    )
    rows = [{"objective/scores": i / 10, "objective/kl": float(i)} for i in range(10)]
    rows.insert(3, {"loss/value_avg": 0.1})  # a logging row without a score
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    summary = embedded_ppo.summarize(str(tmp_path))
    assert summary["rollouts"] == 10 and summary["rollouts_averaged"] == 5
    assert (summary["correct_before"], summary["correct_after"]) == (32, 64)
    assert summary["score_first_rollouts"] == 0.2 and summary["score_last_rollouts"] == 0.7
    assert summary["kl_last"] == 9.0 and summary["train_seconds"] == 9.5
