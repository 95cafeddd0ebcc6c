"""The busy-machine thread policy through the Python API (slimrl/machine.py:apply_thread_policy): with other running
jobs torch's threads are lowered once per process with one notice; the user's torch.set_num_threads, thread
variables and SLIMRL_THREADS=keep win; a patched trainer's construction applies it (no CLI involved)."""

from __future__ import annotations

import logging
import tempfile

import pytest
import torch

from slimrl import machine


@pytest.fixture
def busy(monkeypatch):
    """A fresh process's policy on a fake 2-core machine with one other running job, torch at its default 2 threads
    (monkeypatched readings: no real load is read); torch's threads put back afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(machine._APPLIED, "_value", False)
    monkeypatch.setattr(machine, "other_running_jobs", lambda: 1)
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
    busy.setattr(machine, "other_running_jobs", lambda: 0)
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
    GRPOTrainer(
        model=tiny_llama(0, vocab_size=256, hidden_size=16, num_layers=1),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
        processing_class=tiny_tokenizer(256),
    )
    assert torch.get_num_threads() == 1 and machine._APPLIED.get()
