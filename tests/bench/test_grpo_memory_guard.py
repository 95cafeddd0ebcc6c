"""bench/grpo_memory_guard.py: the slimrl GRPO step's working memory against the committed figure.

The verdict's arithmetic runs in the default tier; the measured runs are slow (one GRPO step at V=152k, completion
512, 1 thread: about a minute or two each on 2 cores): the guard passes on the code as it is, and its negative
control, an extra [T, V] fp32 buffer held across the backward, trips it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "grpo_memory_guard.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))

import grpo_memory_guard as guard  # noqa: E402

MiB = 1024**2


def test_verdict_passes_within_the_tolerance_and_fails_past_it():
    assert guard.verdict(110 * MiB, 100 * MiB, 0.10)[0]
    ok, line = guard.verdict(111 * MiB, 100 * MiB, 0.10)
    assert not ok and line.startswith("REGRESSION") and "1.110x" in line
    ok, line = guard.verdict(80 * MiB, 100 * MiB, 0.10)
    assert ok and "refresh" in line
    with pytest.raises(ValueError, match="positive"):
        guard.verdict(0, 100 * MiB, 0.10)


def test_the_committed_figure_is_the_issue_config_and_under_005x_stock():
    ref = guard.committed_figure(guard.COMMITTED)
    assert (ref["vocab"], ref["completion"]) == (152064, 512)
    with open(guard.COMMITTED) as f:
        row = json.load(f)["rows"][0]
    assert ref["working"] <= 0.05 * row["stock"]["working"]
    assert row["slimrl"]["working_steps"][0] == max(row["slimrl"]["working_steps"])  # why the guard runs one step


def _run_guard(tmp_path, *args: str) -> tuple[int, dict, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    args = ("--json", str(tmp_path / "guard.json"), *args)  # the results file, not bench/results/
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1]), proc.stdout


@pytest.mark.slow
def test_the_guard_passes_on_the_code_as_it_is(tmp_path):
    rc, result, out = _run_guard(tmp_path)
    assert rc == 0 and result["passes"], out
    assert result["measured"] <= 1.10 * result["committed"]


@pytest.mark.slow
def test_the_negative_control_an_extra_t_by_v_buffer_trips_it(tmp_path):
    rc, result, out = _run_guard(tmp_path, "--control-buffer")
    assert rc == 1 and not result["passes"] and result["control_buffer"], out
    assert "REGRESSION" in out
    assert result["measured"] - result["committed"] >= 0.9 * 512 * 152064 * 4  # the buffer is what it measured
