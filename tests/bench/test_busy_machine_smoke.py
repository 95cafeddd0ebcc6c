"""bench/busy_machine.py: each arm's environment is what its name says (torch's defaults even when the caller
exported thread variables), and the `--quick` run measures every arm quiet and busy (slow tier: six fresh processes).
Times are not asserted (no speed targets in tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "busy_machine.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("busy_machine_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arm_environments(bench):
    caller = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE", "PATH": "/bin"}
    assert bench.arm_env("default", caller) == {"PATH": "/bin"}
    assert bench.arm_env("passive", caller) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    both = bench.arm_env("passive+threads=3", caller)
    assert (both["OMP_WAIT_POLICY"], both["OMP_NUM_THREADS"], both["MKL_NUM_THREADS"]) == ("PASSIVE", "3", "3")
    with pytest.raises(SystemExit, match="unknown arm part 'pasive'"):
        bench.arm_env("pasive", caller)


def test_default_arms_cover_fewer_threads(bench):
    assert bench.default_arms(8) == ["default", "passive", "threads=4", "threads=1", "passive+threads=4"]
    assert bench.default_arms(2) == ["default", "passive", "threads=1", "passive+threads=1"]
    assert bench.default_arms(1) == ["default", "passive"]


@pytest.mark.slow
def test_quick_run_measures_every_arm_quiet_and_busy(tmp_path):
    out = tmp_path / "busy.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--output", str(out)], env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["arm"] for row in result["rows"]] == ["default", "passive", "threads=1"]
    threads = {row["arm"]: row["threads"] for row in result["rows"]}
    assert threads["threads=1"] == 1 and 1 <= threads["default"] <= result["cores"]  # torch: physical cores
    for row in result["rows"]:
        assert row["quiet_s"] > 0 and row["busy_s"] > 0 and row["rival_rate"] > 0
    assert result["best"] in threads and "least degraded" in proc.stdout
