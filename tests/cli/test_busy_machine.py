"""The `slimrl` executable's thread settings on a machine other jobs share (slimrl/machine.py): torch's defaults
where it is quiet, PASSIVE waiting and fewer threads where it is busy, the user's own variables always winning, one
line naming old and new values; `main` called in-process changes nothing."""

import os
import sys

import pytest

from slimrl import machine
from slimrl.cli import run


def test_quiet_machine_keeps_torchs_defaults():
    assert machine.busy_thread_settings(0, 2, {}) == {}


@pytest.mark.parametrize("others, cores, threads", [(1, 2, "1"), (2, 2, "1"), (1, 16, "15"), (4, 8, "4")])
def test_busy_machine_waits_passively_with_fewer_threads(others, cores, threads):
    settings = machine.busy_thread_settings(others, cores, {})
    assert settings == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    line = machine.describe(others, cores, settings)
    assert f"torch threads {cores} -> {threads}" in line and "OMP_WAIT_POLICY unset -> PASSIVE" in line


@pytest.mark.parametrize("variable", machine.USER_THREAD_VARIABLES)
def test_the_users_own_thread_variables_win(variable):
    assert machine.busy_thread_settings(5, 2, {variable: "2"}) == {}


def test_the_executable_adapts_before_main_and_says_so(monkeypatch, caplog):
    env = {}
    monkeypatch.setattr(machine._APPLIED, "_value", False)  # a fresh process
    monkeypatch.setattr(machine._WATCH, "_value", None)  # and the between-steps watch it starts, put back after
    monkeypatch.setattr(machine, "_torch_loaded", lambda: False)  # the executable runs before torch is imported
    monkeypatch.setattr(machine, "other_running_jobs", lambda: 2)
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    monkeypatch.setattr(machine.os, "environ", env)
    seen = {}
    monkeypatch.setattr("slimrl.cli.main", lambda argv: seen.setdefault("env", dict(env)) and 0)
    monkeypatch.setattr(sys, "argv", ["slimrl", "grpo", "--max_steps", "1"])
    with caplog.at_level("WARNING", logger="slimrl"):
        run()
    assert seen["env"]["OMP_WAIT_POLICY"] == "PASSIVE" and seen["env"]["OMP_NUM_THREADS"] == "1"
    assert any("torch threads 2 -> 1" in r.getMessage() for r in caplog.records)
    env.clear()
    monkeypatch.setattr(sys, "argv", ["slimrl", "doctor"])  # not a training command: nothing set
    seen.clear()
    run()
    assert seen["env"] == {}


def test_a_competing_process_is_counted_and_this_one_is_not():
    import subprocess

    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = machine.other_running_jobs(samples=9, interval=0.05)
    finally:
        rival.kill()
    assert busy >= 1


def test_main_in_process_leaves_the_environment_alone(monkeypatch):
    monkeypatch.setattr(machine, "other_running_jobs", lambda: 9)
    before = dict(os.environ)
    from slimrl.cli import main

    main(["--version"])
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    "command, applied",
    [
        ("grpo", True),
        ("dpo", True),
        ("kto", True),
        ("orpo", True),
        ("ppo", True),
        ("gkd", True),
        ("online-dpo", True),
        ("plan", False),
    ],
)
def test_every_training_command_applies_the_thread_policy_before_torch(monkeypatch, command, applied):
    import slimrl.cli as cli
    from slimrl import machine

    calls = []
    monkeypatch.setattr(machine, "apply_thread_policy", lambda: calls.append(1))
    monkeypatch.setattr(cli, "main", lambda argv: 0)
    monkeypatch.setattr(cli.sys, "argv", ["slimrl", command])
    assert cli.run() == 0 and bool(calls) is applied
