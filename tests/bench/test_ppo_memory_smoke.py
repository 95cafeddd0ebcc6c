"""Smoke test of bench/ppo_memory.py: the `--quick` run of every arm (each in its own process) completes, trains
the rollouts asked for and reports a peak for each. No memory target is asserted here (targets live in the
benchmark, run on a quiet machine). Marked slow: three fresh processes import torch, transformers and TRL (~30 s on
a quiet 2-core machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "ppo_memory.py")


@pytest.mark.slow
def test_quick_run_measures_every_arm(tmp_path):
    out_json = tmp_path / "ppo.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--markdown", "--json", str(out_json)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out_json.read_text())["rows"]
    assert set(rows) == {"four", "slimrl", "slimrl-full"}
    for arm, row in rows.items():
        assert "error" not in row, (arm, row)
        assert row["peak"] >= row["static"] > 0 and row["rollouts"] == 2, arm
    assert "| slimrl | 1 base (LoRA) + reward |" in proc.stdout and "peak / four-model" in proc.stdout
