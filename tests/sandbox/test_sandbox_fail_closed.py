"""Fail closed: model-written code runs only when every kernel layer is on, unless the weaker sandbox is accepted.

A machine without Landlock (an old kernel), or one refusing unprivileged user namespaces (Docker's default profile),
is simulated for real: a trainer process installs a seccomp filter on itself that makes the Landlock system calls
fail with ENOSYS, or unshare with EPERM, as such a kernel would; the sandbox processes it starts inherit the filter.
The same script without the filter is the control: there the function runs by default.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import slimrl
from slimrl.sandbox import LockedDownFunction, SandboxError, SandboxUnavailable, Settings, layers, protection

SYSCALLS = {  # landlock_create_ruleset, _add_rule, _restrict_self; unshare
    "x86_64": {"landlock": (444, 445, 446), "namespaces": (272,)},
    "aarch64": {"landlock": (444, 445, 446), "namespaces": (97,)},
}
ERRNO = {"landlock": "ENOSYS", "namespaces": "EPERM"}

TRAINER = """
import errno, json, logging, sys
from slimrl.sandbox import kernel
layer, numbers, error, opt_in = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
if numbers:
    assert kernel.install_filter(kernel._seccomp_program(kernel._AUDIT_ARCH[kernel.os.uname().machine],
                                                         tuple(numbers), getattr(errno, error))) == "on"
warnings = []
logging.getLogger("slimrl").addHandler(logging.Handler())
logging.getLogger("slimrl").handlers[-1].emit = lambda record: warnings.append(record.getMessage())
from slimrl.sandbox import SandboxUnavailable, create_locked_down_function, protection
out = {"protection": protection()}
for attempt in range(2):
    add = create_locked_down_function("def add(a, b):\\n    return a + b\\n", allow_weaker_sandbox=opt_in == "field")
    try:
        out[f"call {attempt}"] = add(2, 3)
    except SandboxUnavailable as exc:
        out[f"call {attempt}"] = "refused: " + str(exc)
    add.close()
out["warnings"] = warnings
print(json.dumps(out))
"""


def trainer(layer: str, opt_in: str = "none", simulate: bool = True) -> dict:
    numbers = SYSCALLS[platform.machine()][layer] if simulate else []
    env = {k: v for k, v in os.environ.items() if k != layers.ALLOW_WEAKER_ENV}
    env["PYTHONPATH"] = str(Path(slimrl.__file__).parents[1])
    if opt_in == "env":
        env[layers.ALLOW_WEAKER_ENV] = "1"
    run = subprocess.run([sys.executable, "-c", TRAINER, layer, json.dumps(numbers), ERRNO[layer], opt_in],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def here():
    if not sys.platform.startswith("linux") or platform.machine() not in SYSCALLS:
        pytest.skip("the simulation filters Linux x86_64 / aarch64 system calls")
    return protection()


@pytest.mark.parametrize(
    "layer, why",
    [("landlock", "this kernel has no Landlock (it needs Linux 5.13+"),
     ("namespaces", "unprivileged user namespaces are refused here")],
    ids=["landlock", "namespaces"],
)  # fmt: skip
def test_a_machine_without_the_layer_refuses_by_default_and_runs_with_the_opt_in(here, layer, why):
    refused = trainer(layer)
    assert refused["protection"][layer].startswith(f"unavailable: {why}")
    verdict = refused["protection"]["model code"]
    assert verdict.startswith("refused by default: missing ") and layer in verdict.split(";")[0]
    message = refused["call 0"]
    assert message.startswith("refused: the sandbox refuses to run model-written code")
    assert f"- {layer}: {why}" in message and layers.WITHOUT[layer] in message  # the layer, why, what it guards
    assert "allow_weaker_sandbox=True" in message and f"{layers.ALLOW_WEAKER_ENV}=1" in message  # the opt-in
    assert refused["call 1"] == message and refused["warnings"] == []
    for opt_in in ("env", "field"):
        accepted = trainer(layer, opt_in)
        assert accepted["call 0"] == accepted["call 1"] == 5
        assert len(accepted["warnings"]) == 1 and "weaker sandbox" in accepted["warnings"][0]  # once per process
        assert f"{layer} unavailable: {why}" in accepted["warnings"][0]


def test_control_without_the_simulated_kernel_the_function_runs_by_default(here):
    if here["model code"] != "runs (every layer on)":
        pytest.skip(f"this machine lacks a layer: {here}")
    control = trainer("landlock", simulate=False)
    assert control["call 0"] == control["call 1"] == 5 and control["warnings"] == []


def test_a_layer_switched_off_needs_the_opt_in_too(monkeypatch):
    monkeypatch.delenv(layers.ALLOW_WEAKER_ENV, raising=False)
    source = "def f():\n    return 7\n"
    refused = LockedDownFunction(source, settings=Settings(layers_off=("seccomp",)))
    with pytest.raises(SandboxUnavailable, match="seccomp: switched off by the caller; without it") as caught:
        refused()
    assert not isinstance(caught.value, SandboxError)  # a reward's `except SandboxError` does not swallow it
    assert refused._process is None  # the source was never sent
    accepted = LockedDownFunction(source, settings=Settings(layers_off=("seccomp",), allow_weaker_sandbox=True))
    assert accepted() == 7
    accepted.close()


def test_bad_settings_are_refused_before_any_process(monkeypatch):
    with pytest.raises(ValueError, match="unknown layers \\['landlok'\\]"):
        Settings(layers_off=("landlok",))
    monkeypatch.setenv(layers.ALLOW_WEAKER_ENV, "maybe")
    for status in ({"landlock": "unavailable: x"}, dict.fromkeys(layers.KERNEL_LAYERS, "on")):  # even all on
        with pytest.raises(ValueError, match="SLIMRL_SANDBOX_ALLOW_WEAKER='maybe'"):
            layers.enforce(status, allow_weaker=True)
    monkeypatch.setenv(layers.ALLOW_WEAKER_ENV, "0")
    with pytest.raises(SandboxUnavailable):
        layers.enforce({"landlock": "unavailable: x", "namespaces": "on", "rlimits": "on", "seccomp": "on"}, False)


SUITE_WITHOUT = """
import errno, sys
from slimrl.sandbox import kernel
numbers, error = tuple(int(n) for n in sys.argv[1].split(",")), getattr(errno, sys.argv[2])
arch = kernel._AUDIT_ARCH[kernel.os.uname().machine]
assert kernel.install_filter(kernel._seccomp_program(arch, numbers, error)) == "on"
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-x", sys.argv[3]]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["landlock", "namespaces"])
def test_the_sandbox_tests_pass_on_a_machine_without_the_layer(here, layer):
    """What CI on such a machine runs: the tests of what the sandbox does accept the weaker sandbox there
    (_layers_here.py); those of the refusal see it. About 45 s per layer on 2 cores."""
    numbers = ",".join(str(n) for n in SYSCALLS[platform.machine()][layer])
    env = {k: v for k, v in os.environ.items() if k != layers.ALLOW_WEAKER_ENV}
    folder = Path(__file__).parent
    run = subprocess.run([sys.executable, "-c", SUITE_WITHOUT, numbers, ERRNO[layer], str(folder)], env=env,
                         cwd=folder.parents[1], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout and "skipped" in run.stdout  # the layer's own checks skip, naming it


def test_the_verdict_doctor_prints(monkeypatch):
    monkeypatch.delenv(layers.ALLOW_WEAKER_ENV, raising=False)
    on = dict.fromkeys(layers.KERNEL_LAYERS, "on")
    without = {**on, "landlock": "unavailable: no Landlock", "seccomp": "unavailable: not Linux"}
    assert layers.verdict(on) == "runs (every layer on)"
    assert layers.verdict(without).startswith("refused by default: missing landlock, seccomp; opt in with ")
    assert (
        layers.verdict(without, allow_weaker=True) == "runs in a weaker sandbox (accepted): missing landlock, seccomp"
    )
    monkeypatch.setenv(layers.ALLOW_WEAKER_ENV, "1")
    assert layers.verdict(without).startswith("runs in a weaker sandbox")
