"""Smoke test of bench/shared_prefix.py: the synthetic GRPO and DPO cases, three arms each in their own process.
No numbers are asserted (no timing targets in tests): only that every arm ran and that sharing was on exactly in the
sharing arm (its forwarded-positions ratio below 1, the others at 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "shared_prefix.py")


@pytest.mark.slow
def test_smoke_synthetic_and_dpo(tmp_path):
    out = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--threads", "1", "--cases", "synthetic", "dpo", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["arm"]) for r in rows] == [
        (c, a) for c in ("synthetic", "dpo") for a in ("stock", "slimrl-off", "slimrl-on")
    ]
    for row in rows:
        assert row["steps"] == 2 and row["s_per_step"] > 0 and row["peak"] > 0
        assert (row["positions"] < 0.9) == (row["arm"] == "slimrl-on"), row
    assert "shared-prefix forwards" in proc.stdout and proc.stdout.count("slimrl-on") == 2
