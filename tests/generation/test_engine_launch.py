"""slimrl.generation.launch: which vLLM executor an engine gets, per launch, and the teardown of a process group it
joined (default tier, no vLLM needed; the 2-process run itself is tests/generation/test_vllm_colocate_ddp.py in the
vLLM tier)."""

import subprocess
import sys

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


EXIT_CHECK = """
import atexit, os, socket
import torch.distributed as dist
from slimrl.generation import launch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))  # runs after later ones
launch.join_launch("cpu")
AFTER_JOIN
print("joined", flush=True)
"""
SCRIPT_ENDS_IT = "dist.destroy_process_group()"
SCRIPT_STARTS_ITS_OWN = (
    SCRIPT_ENDS_IT + "\nos.environ['MASTER_PORT'] = str(free_port())\ndist.init_process_group('gloo')"
)


@pytest.mark.parametrize(
    "after_join, alive_at_exit",
    [("pass", False), (SCRIPT_ENDS_IT, False), (SCRIPT_STARTS_ITS_OWN, True)],
    ids=["left-alive", "script-ended-it", "script-started-its-own"],
)
def test_the_group_slimrl_joined_and_only_that_one_is_destroyed_at_exit(after_join, alive_at_exit):
    code = EXIT_CHECK.replace("AFTER_JOIN", after_join)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "joined" in done.stdout and f"group alive at exit: {alive_at_exit}" in done.stdout, (
        done.stdout,
        done.stderr,
    )
    if not alive_at_exit:
        assert done.returncode == 0, done.stderr[-2000:]


def test_without_the_exit_handler_the_group_outlives_the_script():
    """Negative control: the same script with the handler's registration removed ends with the group alive."""
    code = "import atexit\n_register = atexit.register\n" + EXIT_CHECK.replace(
        'launch.join_launch("cpu")\nAFTER_JOIN',
        "atexit.register = lambda f, *a: f if f is launch.destroy_joined_group else _register(f, *a)\n"
        'launch.join_launch("cpu")\natexit.register = _register',
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "group alive at exit: True" in done.stdout, (done.stdout, done.stderr[-2000:])
