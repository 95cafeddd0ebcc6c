"""Smoke test of bench/rollout_overhead.py: the `--smoke` run of a 16-bit config after an SFT run and of the 4-bit
config completes, times every arm of every repeat on both clocks, and the rollout inside the patched GRPOTrainer
sampled the same tokens as `model.generate` on the reference model (so both arms did the same work), with no head or
swap installed twice. No time target is asserted here (the benchmark states the goal, run on a quiet machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "rollout_overhead.py")
CONFIGS = ["16bit+sft"] + (["4bit"] if importlib.util.find_spec("bitsandbytes") else [])


@pytest.mark.slow
def test_smoke_run_times_every_arm_on_the_same_tokens(tmp_path):
    out_json = tmp_path / "rollout.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--configs", *CONFIGS, "--json", str(out_json)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out_json.read_text())
    assert data["provenance"]["commit"] and "same tokens" in data["stdout"]
    results = {r["config"]: r for r in data["results"]}
    assert set(results) == set(CONFIGS)
    for config, result in results.items():
        arms = {"rollout", "generate"} | ({"generate_dequantized"} if config.startswith("4bit") else set())
        assert set(result["median_s"]) == set(result["median_cpu_s"]) == arms, config
        assert len(result["repeats"]) == 2 and result["repeats"][0]["warmup"], config  # a warm-up, then 1 timed
        assert all(r[f"{arm}_s"] > 0 for r in result["repeats"] for arm in arms), config
        assert all(result["same_tokens"].values()) and result["stacked"] == [], config
    assert results["16bit+sft"]["sft_s"] > 0
