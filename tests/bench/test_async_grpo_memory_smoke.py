"""Smoke test of bench/async_grpo_memory.py: the `--quick` run end to end (both arms in their own processes). Numbers
are not asserted (no memory targets in tests); only that each arm measures, the two run the same computation (equal
losses: the stock arm's packed rows through slimrl's tree attention, its head TRL's own), and the table and JSON come
out. Marked slow: two fresh processes import torch, transformers and TRL and train two steps each (~30 s on a quiet
2-core machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "async_grpo_memory.py")


@pytest.mark.slow
def test_quick_run_measures_both_arms_on_the_same_computation(tmp_path):
    out_json = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--json", str(out_json), "--markdown"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out_json.read_text())["rows"]
    stock, slimrl = row["stock"], row["slimrl"]
    for arm in (stock, slimrl):
        assert "error" not in arm and not arm["stopped"], arm
        assert arm["steps"] == 2 and len(arm["losses"]) == 2 and 0 < arm["working"] < arm["peak"]
    assert stock["losses"][0] != stock["losses"][1], "both steps trained on the same samples"
    for s, m in zip(stock["losses"], slimrl["losses"]):
        assert abs(s - m) <= 1e-5 * abs(s), (stock["losses"], slimrl["losses"])
    assert proc.stdout.splitlines()[-1].startswith("| async_grpo | 2048 | 16 | ")
