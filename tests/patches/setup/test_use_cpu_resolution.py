"""`use_cpu` under a multi-process launch on a machine without an accelerator (slimrl.patches.setup.distributed).

In-process: a real 2-process launch is the distributed tier's (tests/distributed: torchrun, where stock TRL fails and
the patched config trains). Here the launcher's environment is faked (WORLD_SIZE) and the accelerator check forced
off, so the tests mean the same on a GPU machine; configs that would build a 2-process PartialState are never
finished (the resolution runs before TRL's `__post_init__`, which would wait for a second process).
"""

import logging

import pytest

from slimrl import notices
from slimrl.patches.setup import distributed
from slimrl.state import config_state


class _Args:
    """The fields the resolution reads, and the user's fields as the patched config records them."""

    def __init__(self, use_cpu=False, user=(), fsdp=None):
        self.use_cpu, self.fsdp = use_cpu, fsdp
        config_state(self).user_fields = frozenset(user)


@pytest.fixture
def cpu_launch(monkeypatch):
    monkeypatch.setattr(distributed, "has_accelerator", lambda: False)
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(notices, "_said", set())  # each notice prints once per process; each test sees its own
    return monkeypatch


def test_unset_use_cpu_becomes_true_with_a_notice(cpu_launch, caplog):
    args = _Args()
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        distributed.resolve_config_device(args)
    assert args.use_cpu is True
    assert [r.getMessage() for r in caplog.records if "use_cpu=True (was False)" in r.getMessage()]


def test_user_use_cpu_false_raises(cpu_launch):
    with pytest.raises(ValueError, match="use_cpu=False, but this machine has no accelerator .* 2 processes"):
        distributed.resolve_config_device(_Args(user=("use_cpu",)))


def test_patched_config_raises_before_trl_builds_the_process_group(cpu_launch, unpatched):
    from slimrl.patches import registry

    registry.PatchFastRL("grpo")
    from trl import GRPOConfig

    with pytest.raises(ValueError, match="use_cpu=False"):
        GRPOConfig(output_dir="unused", use_cpu=False, bf16=False, per_device_train_batch_size=2, num_generations=2)


@pytest.mark.parametrize("case", ["one process", "accelerator", "user True", "accelerate --cpu", "rank 1"])
def test_left_alone(cpu_launch, caplog, case):
    args = _Args(use_cpu=case == "user True", user=("use_cpu",) if case == "user True" else ())
    if case == "one process":
        cpu_launch.setenv("WORLD_SIZE", "1")
    if case == "accelerator":
        cpu_launch.setattr(distributed, "has_accelerator", lambda: True)
    if case == "accelerate --cpu":
        cpu_launch.setenv("ACCELERATE_USE_CPU", "true")
    if case == "rank 1":  # resolved, but the notice is rank 0's
        cpu_launch.setenv("RANK", "1")
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        distributed.resolve_config_device(args)
    assert args.use_cpu is (case in ("user True", "rank 1"))
    assert not caplog.records


def test_mpi_world_size_counts(cpu_launch):
    cpu_launch.delenv("WORLD_SIZE")
    cpu_launch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert distributed.launched_processes() == 4


@pytest.mark.parametrize("how", ["config", "accelerate launch", "config with use_cpu=True"])
def test_fsdp_on_cpu_processes_raises(cpu_launch, how):
    args = _Args(fsdp="full_shard" if how != "accelerate launch" else None, use_cpu=how.endswith("use_cpu=True"))
    if how == "accelerate launch":
        cpu_launch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="FSDP was asked for, but the 2 processes train on CPUs"):
        distributed.resolve_config_device(args)


def test_fsdp_with_an_accelerator_is_left_to_accelerate(cpu_launch):
    cpu_launch.setattr(distributed, "has_accelerator", lambda: True)
    args = _Args(fsdp="full_shard")
    distributed.resolve_config_device(args)
    assert args.use_cpu is False
