"""Smoke tests of bench/preference_memory.py: the `--quick` run end to end (both arms in their own processes), the
memory-limit watchdog, and how a stopped arm turns ratios into bounds. Numbers are not asserted (no timed or memory
targets in tests); only that the benchmark measures, runs the same computation in both arms, and reports honestly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "preference_memory.py")
GiB = 1024**3


def run_bench(tmp_path, *flags: str) -> tuple[str, dict]:
    out_json = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--json", str(out_json), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out_json.read_text())


@pytest.fixture(scope="module")
def bench_module():
    spec = importlib.util.spec_from_file_location("preference_memory_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_dpo_both_arms_measure_the_same_run(tmp_path):
    stdout, result = run_bench(tmp_path, "--trainers", "dpo", "--offload", "--markdown")
    (row,) = result["rows"]
    stock, slimrl = row["stock"], row["slimrl"]
    for arm in (stock, slimrl):
        assert "error" not in arm and not arm["stopped"], arm
        assert arm["steps"] == 2 and len(arm["losses"]) == 2
        assert arm["row_length"] == 64  # --quick length: nothing truncated, nothing added
        assert arm["checkpointing_active"] is True  # TRL's default gradient_checkpointing in both arms
        assert 0 < arm["working"] < arm["peak"] and arm["s_per_step"] > 0
    assert slimrl["slimrl_checkpointing_mode"] == "offload" and slimrl["offload_tensors_seen"] > 0
    assert stock["offload_tensors_seen"] is None
    for s, m in zip(stock["losses"], slimrl["losses"]):
        assert abs(s - m) <= 1e-5 * abs(s), (stock["losses"], slimrl["losses"])
    assert stdout.splitlines()[-1].startswith("| dpo | 64 | ")


def test_watchdog_stops_an_arm_past_the_limit(tmp_path):
    # 0.25 GiB is passed while torch/TRL import: both arms must be stopped by the benchmark, not finish
    stdout, result = run_bench(tmp_path, "--trainers", "orpo", "--mem_limit_gb", "0.25")
    (row,) = result["rows"]
    for arm in (row["stock"], row["slimrl"]):
        assert arm["stopped"] is True and arm["rss_at_stop"] > arm["limit"] == int(0.25 * GiB)
    assert "> 0.25 (stopped)" in stdout


def test_stopped_stock_arm_gives_upper_bound_ratios(bench_module):
    limit = 18 * GiB
    stock = {"stopped": True, "limit": limit, "step_base": 2 * GiB}
    slimrl = {"stopped": False, "peak": 4.5 * GiB, "working": 2 * GiB, "s_per_step": 10.0, "losses": [1.0]}
    row = {"trainer": "orpo", "length": 2048, "stock": stock, "slimrl": slimrl}
    head, (line,) = bench_module.table_lines([row])
    cell = dict(zip(head, line))
    assert cell["stock peak GiB"] == "> 18 (stopped)"
    assert cell["peak ratio"] == "<= 0.25"  # 4.5 / 18
    assert cell["working ratio"] == "<= 0.12"  # 2 / (18 - 2)
    assert cell["time ratio"] == "n/a"
    finished = dict(stock, stopped=False, peak=9 * GiB, working=4 * GiB, s_per_step=10.0, losses=[1.0])
    _, (line,) = bench_module.table_lines([dict(row, stock=finished)])
    assert dict(zip(head, line))["peak ratio"] == "0.50"  # a finished arm gives a plain ratio
