"""bench/notebooks_unsloth.py without running a notebook (the tier's test and the other job are stand-ins): each row
gets its setting and limit and fails the bench when over it; "beside" fails when the other job was not running for
the whole of the notebooks' time, and "alone" starts no other job."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))

import notebooks_unsloth as bench  # noqa: E402


class FakeJob:
    def __init__(self, ends_early: bool):
        self.ends_early, self.stopped = ends_early, False

    def poll(self):
        return 0 if self.ends_early else None

    def terminate(self):
        self.stopped = True

    def wait(self):
        return 0


def stand_ins(monkeypatch, wall_s: float, ends_early: bool = False) -> list[FakeJob]:
    started = []

    def other_job(output_dir):
        started.append(FakeJob(ends_early))
        return started[-1]

    monkeypatch.setattr(bench, "other_job", other_job)
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    monkeypatch.setattr(
        bench, "tier_rows", lambda vllm, path: (0, [{"notebook": "A.py", "ends": "exits 0", "wall_s": wall_s}])
    )
    return started


def test_rows_carry_setting_and_limit_and_a_slow_one_is_over_it(monkeypatch):
    started = stand_ins(monkeypatch, wall_s=400.0)
    code, rows = bench.timed("alone", vllm=False)
    assert code == 0 and started == []  # alone: no other job
    assert rows == [
        {
            "notebook": "A.py",
            "ends": "exits 0",
            "wall_s": 400.0,
            "setting": "alone",
            "limit_s": 300,
            "within_limit": False,
        }
    ]
    code, rows = bench.timed("beside", vllm=False)
    assert code == 0 and rows[0]["within_limit"] and rows[0]["limit_s"] == 900
    assert len(started) == 1 and started[0].stopped  # the other job is stopped after the notebooks


def test_beside_fails_when_the_other_job_ended_first(monkeypatch):
    started = stand_ins(monkeypatch, wall_s=10.0, ends_early=True)
    code, rows = bench.timed("beside", vllm=False)
    assert code == 1 and rows[0]["within_limit"] and started[0].stopped
