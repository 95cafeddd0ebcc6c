"""bench/gpu_memory.py without a GPU: the longest-fit search and the guess (pure functions, fake probes), the report's
ratios and target verdicts (rows as the children write them), and (slow tier) the --smoke run end to end on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import gpu_memory  # noqa: E402

import _gpu_report as report  # noqa: E402

GiB = 1024**3


def _probe(limit, seen):
    def probe(length):
        seen.append(length)
        return length <= limit

    return probe


def test_longest_fit_gallops_then_bisects():
    seen = []
    found = gpu_memory.longest_fit(_probe(20000, seen), start=8192, resolution=1024, maximum=65536)
    assert found["longest"] == 19456 and found["first_failure"] == 20480
    assert seen == [8192, 16384, 32768, 24576, 20480, 18432, 19456]
    assert found["probes"] == [(n, n <= 20000) for n in seen]


def test_longest_fit_from_a_good_guess_takes_few_probes():
    seen = []
    found = gpu_memory.longest_fit(_probe(20000, seen), start=18432, resolution=1024, maximum=65536, step=1024)
    assert found["longest"] == 19456 and found["first_failure"] == 20480 and len(seen) == 4


@pytest.mark.parametrize("limit, longest, failure", [(3000, 2048, 3072), (100, None, 1024), (10**6, 65536, None)])
def test_longest_fit_below_start_nothing_and_everything(limit, longest, failure):
    found = gpu_memory.longest_fit(_probe(limit, []), start=8192, resolution=1024, maximum=65536)
    assert (found["longest"], found["first_failure"]) == (longest, failure)


def test_longest_fit_stops_with_the_bracket_when_the_prober_has_no_time_left():
    answers = iter([True, True, False, None])  # 8192 fits, 16384 fits, 32768 fails, then the deadline
    found = gpu_memory.longest_fit(lambda n: next(answers), start=8192, resolution=1024, maximum=65536)
    assert found["stopped"] and (found["longest"], found["first_failure"]) == (16384, 32768)
    assert [n for n, _ in found["probes"]] == [8192, 16384, 32768]


def test_clock_starts_no_child_after_the_deadline():
    assert gpu_memory.Clock(0).run(["--child", "grpo"], threads=1, timeout=10) is None


def test_guess_from_a_linear_fit_of_the_reserved_peak():
    rows = [
        {
            "kind": "grpo",
            "model": "8b",
            "arm": "stock",
            "length": n,
            "reserved": 10 * GiB + n * 2**20,
            "device_total": 80 * GiB,
        }
        for n in (2048, 8192)
    ]
    assert gpu_memory.guess_longest(rows, "8b", "stock", 1024) == 70 * 1024  # (80 - 10) GiB at 1 MiB per token
    assert gpu_memory.guess_longest(rows[:1], "8b", "stock", 1024) is None
    assert gpu_memory.guess_longest(rows, "8b", "slimrl", 1024) is None


def _run(arm, peak, seconds, **extra):
    return {
        "kind": "grpo",
        "arm": arm,
        "model": "8b",
        "length": 8192,
        "rows": 8,
        "rollouts": "synthetic",
        "device": "NVIDIA H100",
        "oom": False,
        "peak": peak * GiB,
        "reserved": peak * GiB,
        "s_per_step": seconds,
        "losses": [0.5],
        **extra,
    }


def _fit(arm, longest, failure):
    return {
        "kind": "bisect",
        "arm": arm,
        "model": "8b",
        "rows": 8,
        "longest": longest,
        "first_failure": failure,
        "failure_reason": "OOM",
        "probes": [(longest, True), (failure, False)],
        "device": "NVIDIA H100",
    }


def test_report_ratios_and_target_verdicts():
    rows = [
        _run("stock", 60, 10.0),
        _run("slimrl", 58, 10.2),
        _run("slimrl-offload", 27, 11.0),
        _fit("stock", 16384, 17408),
        _fit("slimrl-offload", 40960, 41984),
    ]
    text = report.render(rows)
    assert text.startswith("# slimrl vs stock TRL on NVIDIA H100")
    assert "| 8b | 8 x 8192 | synthetic | slimrl-offload | 27.00 | 27.00 | 11.00 | 0.45 | 1.10 | 0.5 |" in text
    targets = text.split("## Targets")[1]
    assert "| 0.45 | met |" in targets and "| 1.10 | NOT met |" in targets and "| 2.50 | NOT met |" in targets


def test_report_marks_out_of_memory_and_missing_rows():
    rows = [_run("stock", 0, 0.0, oom=True), _run("slimrl-offload", 27, 11.0)]
    text = report.render(rows)
    assert "| stock | 0.00 | 0.00 | OOM | OOM | OOM |" in text
    assert "| slimrl-offload | 27.00 | 27.00 | 11.00 | n/a | n/a |" in text  # no ratio against an OOM stock
    assert text.count("not measured") == 3


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu_memory.py"), "--smoke", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    runs = [r for r in rows if r["kind"] in ("grpo", "pref")]
    assert len(runs) == 9 and all(not r["oom"] and "error" not in r for r in runs)
    assert all(r["mean_length"] == [16.0, 16.0] for r in runs if r["kind"] == "grpo")  # the forced length
    for kind, trainer in (("grpo", None), ("pref", "dpo"), ("pref", "orpo")):  # same computation in every arm
        losses = [r["losses"] for r in runs if r["kind"] == kind and r.get("trainer") == trainer]
        assert all(loss == pytest.approx(losses[0], rel=1e-5, abs=1e-7) for loss in losses)
    assert [r["longest"] for r in rows if r["kind"] == "bisect"] == [32, 32, 32]
    assert "## Targets" in proc.stdout
