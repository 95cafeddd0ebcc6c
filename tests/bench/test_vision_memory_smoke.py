"""Smoke test of bench/vision_memory.py: the `--quick` run end to end (each arm in its own process). Numbers are not
asserted (no memory or time targets in tests); only that both arms ran the same computation (same losses) and that
the slimrl arm's vision tower encoded fewer images than stock's."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_quick_run_measures_both_arms(tmp_path):
    out_json = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "vision_memory.py"), "--quick", "--json", str(out_json)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stock, slimrl = json.loads(out_json.read_text())
    assert "error" not in stock and "error" not in slimrl, (stock, slimrl)
    assert stock["losses"] and len(stock["losses"]) == len(slimrl["losses"])
    for a, b in zip(stock["losses"], slimrl["losses"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a))
    assert 0 < slimrl["images_encoded"] < stock["images_encoded"]
