"""bench/side_by_side.py: a step counts as side by side only when it began and ended while both jobs trained, and
slowdowns are against the same arm alone; the `--quick` run (slow tier) measures both arms alone and together with
every step in its JSON. Times are not asserted (no speed targets in tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "side_by_side.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("side_by_side_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_steps_while_both_train_count(bench):
    first = {"steps": [(0, 1), (1, 2), (2, 5), (5, 8), (8, 9)]}  # trains 0..9
    second = {"steps": [(3, 6), (6, 9.5), (9.5, 10)]}  # trains 3..10
    # together from 3 (second's first step) to 9 (first's last): first's (5, 8) and (8, 9), second's (3, 6)
    assert bench.side_by_side_steps([first, second]) == [[3, 1], [3]]
    assert bench.side_by_side_steps([{"steps": [(0, 1)]}, {"steps": [(2, 3)]}]) == [[], []]  # never together


def test_slowdown_is_against_the_same_arm_alone(bench):
    raw = {
        "slimrl": {
            "alone": [{"steps": [(0, 1), (1, 2), (2, 3)]}],
            "together": [{"steps": [(0, 2), (2, 4)], "threads": 1}, {"steps": [(0, 3), (3, 4)], "threads": 1}],
        },
        "keep": {
            "alone": [{"steps": [(0, 0.5)]}],
            "together": [{"steps": [(0, 5)], "threads": 2}, {"steps": [(0, 5)], "threads": 2}],
        },
    }
    rows = {(r["arm"], r["job"]): r for r in bench.summarize(raw)}
    assert rows["slimrl", 1]["slowdown"] == 2 and rows["slimrl", 2]["slowdown"] == 2  # medians 2 and 2 vs 1
    assert rows["keep", 1]["slowdown"] == 10 and rows["keep", 1]["threads_at_end"] == 2


@pytest.mark.slow
def test_quick_run_records_every_step_of_both_arms(tmp_path):
    out = tmp_path / "pair.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--output", str(out)],
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {(r["arm"], r["scenario"], r["job"]) for r in result["rows"]} == {
        (arm, "together", job) for arm in ("slimrl", "keep") for job in (1, 2)
    }
    for arm in ("slimrl", "keep"):
        assert len(result["raw"][arm]["alone"][0]["steps"]) == 2 and len(result["raw"][arm]["together"]) == 2
