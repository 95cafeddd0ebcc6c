"""Smoke test of bench/distill_memory.py: the `--quick` run end to end (both arms in their own processes). Numbers are
not asserted (no memory targets in tests); only that each arm measures, the two run the same computation, and the
table and JSON come out. Marked slow: four fresh processes import torch, transformers and TRL and run two steps each
(~1 min on a quiet 2-core machine, several on a busy one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "distill_memory.py")


@pytest.mark.slow
def test_quick_run_measures_both_arms_on_the_same_computation(tmp_path):
    out_json = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--trainers", "gkd", "distillation", "--json", str(out_json), "--markdown"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["trainer"] for r in rows] == ["gkd", "distillation"]
    for row in rows:
        stock, slimrl = row["stock"], row["slimrl"]
        for arm in (stock, slimrl):
            assert "error" not in arm and not arm["stopped"], arm
            assert arm["steps"] == 2 and len(arm["losses"]) == 2 and 0 < arm["working"] < arm["peak"]
        assert stock["row_length"] == slimrl["row_length"] > 0
        for s, m in zip(stock["losses"], slimrl["losses"]):
            assert abs(s - m) <= 1e-5 * abs(s), (stock["losses"], slimrl["losses"])
    assert proc.stdout.splitlines()[-1].startswith("| distillation | 48 | ")
