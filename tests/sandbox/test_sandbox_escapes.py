"""Escape attempts against the sandbox's process and kernel layers, each refused or killed while the caller goes on.

The interpreter layer is switched off here (interpreter_policy=False, os/socket/subprocess preloaded), so each attempt
reaches the kernel: these are what a function that got past the source checks could do. Then each kernel layer alone
refuses what it owns (the others switched off), and a negative control with every layer off shows the attempts work
without them, so the tests can fail.
"""

import os
import signal
import socket

import pytest

from slimrl.sandbox import LockedDownFunction, SandboxError, Settings, protection

PRELOAD = ("os", "socket", "subprocess", "gc")
LAYERS = ("namespaces", "landlock", "rlimits", "seccomp")


@pytest.fixture(scope="module")
def layers():
    return protection()


def run(source, *, only=None, off=(), time_limit=5.0, memory_mb=512):
    """Call the function `source` defines (no arguments) with the kernel layers in `only` (default: all) on."""
    layers_off = tuple(name for name in LAYERS if name in off or (only is not None and name not in only))
    settings = Settings(memory_mb=memory_mb, interpreter_policy=False, preload=PRELOAD, layers_off=layers_off,
                        allow_weaker_sandbox=True)  # fmt: skip
    function = LockedDownFunction(source, time_limit=time_limit, settings=settings)
    try:
        return function()
    finally:
        function.close()


def refused(source, **kwargs) -> str:
    with pytest.raises((SandboxError, TimeoutError)) as caught:
        run(source, **kwargs)
    return str(caught.value)


@pytest.fixture
def listener():
    """A TCP server on this machine's loopback; the test's own connection to it works (control)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    socket.create_connection(server.getsockname(), timeout=2).close()
    yield server.getsockname()[1]
    server.close()


def test_protection_names_each_layer_and_whether_model_code_runs(monkeypatch):
    monkeypatch.delenv("SLIMRL_SANDBOX_ALLOW_WEAKER", raising=False)
    layers = protection()
    assert set(layers) == {"process", "interpreter", *LAYERS, "model code"}
    missing = [name for name in LAYERS if not layers[name].startswith("on")]
    assert all(layers[name].startswith("unavailable: ") for name in missing)
    if missing:  # fail closed: refused by default, the missing layers named
        assert layers["model code"].startswith("refused by default") and all(m in layers["model code"] for m in missing)
    else:
        assert layers["model code"] == "runs (every layer on)"


def test_file_reads_are_refused(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's data")
    monkeypatch.chdir(tmp_path)
    assert "OSError" in refused("def f():\n    return open('/etc/passwd').read()")
    assert "OSError" in refused(f"def f():\n    return open({str(secret)!r}).read()")
    assert "OSError" in refused("def f():\n    return open('secret.txt').read()")  # its cwd is an empty folder
    assert "OSError" in refused("def f():\n    import os\n    return os.listdir('/')")


def test_file_writes_are_refused(tmp_path):
    target = tmp_path / "written.txt"
    assert "OSError" in refused(f"def f():\n    open({str(target)!r}, 'w').write('x')\n    return 1")
    assert not target.exists()


def test_commands_and_processes_do_not_start(tmp_path):
    marker = tmp_path / "ran"
    status = run(f"def f():\n    import os\n    return os.system('touch {marker}')")
    assert status != 0 and not marker.exists()
    assert "OSError" in refused(f"def f():\n    import subprocess\n    return subprocess.run(['touch', '{marker}'])")
    assert not marker.exists()
    assert "PermissionError" in refused("def f():\n    import os\n    while True:\n        os.fork()")  # fork bomb


def test_subclasses_walk_reaches_os_but_not_the_machine(tmp_path):
    marker = tmp_path / "walked"
    walk = (
        "def f():\n"
        "    close = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
        f"    return close.__init__.__globals__['system']('touch {marker}')\n"
    )
    assert run(walk) != 0 and not marker.exists()


def test_network_is_refused(listener):
    connect = (
        f"def f():\n    import socket\n    socket.create_connection(('127.0.0.1', {listener}), timeout=2)\n    return 1"
    )
    assert "Error" in refused(connect)


def test_trainer_process_cannot_be_signalled_or_read():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    try:
        assert "PermissionError" in refused("def f():\n    import os\n    os.kill(os.getppid(), 10)\n    return 1")
        assert "OSError" in refused("def f():\n    import os\n    return open(f'/proc/{os.getppid()}/mem', 'rb')")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == []


def test_memory_and_time_limits_stop_the_function():
    assert "MemoryError" in refused("def f():\n    return len(bytearray(10 * 1024**3))", memory_mb=256)
    assert "Timed out after 0.5s" in refused("def f():\n    while True:\n        pass", time_limit=0.5)


@pytest.mark.parametrize(
    "layer, source, expected",
    [
        ("landlock", "def f():\n    return open('/etc/passwd').read()", "Permission denied"),
        ("rlimits", "def f():\n    return open('/etc/passwd').read()", "Too many open files"),
        ("rlimits", "def f():\n    return len(bytearray(10 * 1024**3))", "MemoryError"),
        ("seccomp", "def f():\n    import os\n    return os.fork()", "Operation not permitted"),
        ("seccomp", "def f():\n    import socket\n    return socket.socket().fileno()", "Operation not permitted"),
        ("namespaces", "CONNECT", "Network is unreachable"),
        ("landlock", "CONNECT", "Permission denied"),
    ],
)
def test_each_layer_alone_refuses_what_it_owns(layers, listener, layer, source, expected):
    if not layers[layer].startswith("on") or (layer == "landlock" and source == "CONNECT" and "ABI 3" in layers[layer]):
        pytest.skip(f"{layer} here: {layers[layer]}")
    if source == "CONNECT":
        source = f"def f():\n    import socket\n    socket.create_connection(('127.0.0.1', {listener}))\n    return 1"
    assert expected in refused(source, only=(layer,))


def test_without_any_layer_the_same_attempts_succeed(listener):
    """Negative control: the attempts above are real; only the layers stop them."""
    assert run("def f():\n    return open('/etc/passwd').read()", only=()).startswith("root:")
    connect = (
        f"def f():\n    import socket\n    socket.create_connection(('127.0.0.1', {listener}), timeout=2)\n    return 1"
    )
    assert run(connect, only=()) == 1


def test_a_sandbox_process_does_not_outlive_a_killed_trainer():
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    import slimrl

    trainer_code = (
        "from slimrl import create_locked_down_function\n"
        "create_locked_down_function('def f():\\n    while True:\\n        pass\\n', time_limit=600)()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(slimrl.__file__).parents[1])}
    trainer = subprocess.Popen([sys.executable, "-c", trainer_code], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = [c for c in psutil.Process(trainer.pid).children() if c.cpu_percent(interval=0.2) > 20]
            if busy:
                break
        assert busy, "the looping function never started"
        sandboxes = psutil.Process(trainer.pid).children()
    finally:
        trainer.kill()
        trainer.wait()
    gone, alive = psutil.wait_procs(sandboxes, timeout=10)
    assert not alive, "sandbox processes outlived their trainer"
