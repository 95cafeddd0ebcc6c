"""The busy-machine thread policy through the Python API (slimrl/machine.py:apply_thread_policy): with other running
jobs torch's threads are lowered once per process with one notice; the user's torch.set_num_threads, thread
variables and SLIMRL_THREADS=keep win; a patched trainer's construction applies it (no CLI involved); between steps
(recheck_thread_policy) a job arriving later lowers them, a quiet machine gets torch's count back, and a count the
user sets ends the watch."""

from __future__ import annotations

import logging
import tempfile

import pytest
import torch

from slimrl import machine, notices
from slimrl.training.thread_watch import ThreadWatch, watch_threads


@pytest.fixture
def busy(monkeypatch):
    """A fresh process's policy on a fake 2-core machine with one other running job, torch at its default 2 threads
    (monkeypatched readings: no real load is read); torch's threads put back afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(machine._APPLIED, "_value", False)
    monkeypatch.setattr(machine._WATCH, "_value", None)
    monkeypatch.setattr(machine, "other_running_jobs", lambda **kw: 1)
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    monkeypatch.setattr(machine, "torch_default_threads", lambda: 2)
    for name in (*machine.USER_THREAD_VARIABLES, machine.OPT_OUT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    try:
        yield monkeypatch
    finally:
        torch.set_num_threads(before)


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]


def test_busy_machine_lowers_torch_threads_once_with_one_notice(busy, caplog):
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        said = machine.apply_thread_policy()
        assert torch.get_num_threads() == 1
        assert said is not None and "torch threads 2 -> 1" in said and "SLIMRL_THREADS=keep" in said
        torch.set_num_threads(2)  # a second trainer in the same process: nothing again
        assert machine.apply_thread_policy() is None and torch.get_num_threads() == 2
    assert len(_notices(caplog)) == 1


def test_quiet_machine_keeps_torchs_threads(busy):
    busy.setattr(machine, "other_running_jobs", lambda **kw: 0)
    assert machine.apply_thread_policy() is None and torch.get_num_threads() == 2


def test_the_users_own_torch_threads_win(busy):
    busy.setattr(machine, "torch_default_threads", lambda: 4)  # 2 threads: not torch's own choice here
    assert machine.apply_thread_policy() is None and torch.get_num_threads() == 2


@pytest.mark.parametrize(
    "variable, value", [("OMP_NUM_THREADS", "2"), ("MKL_NUM_THREADS", "2"), ("SLIMRL_THREADS", "keep")]
)
def test_thread_variables_and_the_opt_out_win(busy, variable, value):
    busy.setenv(variable, value)
    assert machine.apply_thread_policy() is None and torch.get_num_threads() == 2


def test_torchs_default_follows_the_thread_variables(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert machine.torch_default_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert machine.torch_default_threads() in (None, *range(1, 4097))


def test_before_torch_loads_the_environment_carries_it(busy):
    env = {}
    busy.setattr(machine, "_torch_loaded", lambda: False)
    said = machine.apply_thread_policy(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert "torch threads 2 -> 1" in said and torch.get_num_threads() == 2  # torch itself untouched


def test_a_patched_trainers_construction_applies_it(busy):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL
    from slimrl.testing import tiny_llama, tiny_tokenizer

    PatchFastRL("grpo")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=tiny_llama(0, vocab_size=256, hidden_size=16, num_layers=1),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
        processing_class=tiny_tokenizer(256),
    )
    assert torch.get_num_threads() == 1 and machine._APPLIED.get()
    assert sum(isinstance(c, ThreadWatch) for c in trainer.callback_handler.callbacks) == 1
    watch_threads(trainer)  # a second call adds none
    assert sum(isinstance(c, ThreadWatch) for c in trainer.callback_handler.callbacks) == 1


def _started_quiet(busy, jobs: list[int]):
    """The policy applied on a quiet machine (torch keeps 2 threads); `jobs[0]` running jobs from then on."""
    busy.setattr(machine, "other_running_jobs", lambda **kw: jobs[0])
    assert machine.apply_thread_policy() is None and torch.get_num_threads() == 2
    return machine._WATCH.get()["last"]


def test_a_job_arriving_during_training_lowers_the_threads_and_quiet_restores_them(busy, caplog):
    jobs = [0]
    busy.setattr(notices, "_said", set())  # a fresh process: no notice said yet
    start = _started_quiet(busy, jobs)
    jobs[0] = 1
    assert machine.recheck_thread_policy(start + 1) is None  # too soon after the last look: nothing read
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        said = machine.recheck_thread_policy(start + machine.RECHECK_SECONDS)
    assert torch.get_num_threads() == 1 and "torch threads 2 -> 1" in said and len(_notices(caplog)) == 1
    assert machine.recheck_thread_policy(start + 2 * machine.RECHECK_SECONDS) is None  # still busy: unchanged
    jobs[0] = 0
    said = machine.recheck_thread_policy(start + 3 * machine.RECHECK_SECONDS)
    assert torch.get_num_threads() == 2 and "torch threads 1 -> 2" in said


def test_a_count_the_user_sets_during_training_ends_the_watch(busy):
    jobs = [0]
    start = _started_quiet(busy, jobs)
    torch.set_num_threads(1)  # the user's own choice, after slimrl looked
    jobs[0] = 0
    assert machine.recheck_thread_policy(start + machine.RECHECK_SECONDS) is None
    assert torch.get_num_threads() == 1 and machine._WATCH.get() is None


def test_nothing_is_watched_where_the_user_chose(busy):
    busy.setenv("SLIMRL_THREADS", "keep")
    assert machine.apply_thread_policy() is None
    assert machine.recheck_thread_policy(1e9) is None and torch.get_num_threads() == 2


def test_this_process_counts_at_least_itself_as_running():
    assert machine.own_running_threads() >= 1
