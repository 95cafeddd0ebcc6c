"""slimrl.generation.launch: which vLLM executor an engine gets, per launch (default tier, no vLLM needed; the
2-process run itself is tests/generation/test_vllm_colocate_ddp.py in the vLLM tier)."""

import pytest

from slimrl.generation import launch


@pytest.fixture
def joined(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "join_launch", calls.append)
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_single_process_keeps_the_in_process_executor(joined, monkeypatch):
    assert launch.engine_launch_kwargs("cpu", seed=3) == {}
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launch.engine_launch_kwargs("cpu", seed=3) == {}
    assert joined == []


def test_each_rank_of_a_launch_joins_the_group_and_gets_its_own_seed(joined, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert launch.engine_launch_kwargs("cpu", seed=3) == {
        "distributed_executor_backend": "external_launcher",
        "seed": 4,
    }
    assert joined == ["cpu"]
