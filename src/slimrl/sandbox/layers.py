"""Fail closed: model-written code runs only when every kernel layer slimrl relies on is on, unless the user accepts
a weaker sandbox (the Settings field `allow_weaker_sandbox`, or SLIMRL_SANDBOX_ALLOW_WEAKER=1 in the environment).

A refusal names each missing layer, why this machine lacks it (kernel.py's reason), what code that gets past the
interpreter filter could then do, and the opt-in. With the opt-in, the weaker sandbox is named in one warning per
process (per set of missing layers).
"""

from __future__ import annotations

import os

from ..notices import notice

ALLOW_WEAKER_ENV = "SLIMRL_SANDBOX_ALLOW_WEAKER"
KERNEL_LAYERS = ("namespaces", "landlock", "rlimits", "seccomp")
# what code past the interpreter filter could do with the layer missing (docs/sandbox.md, "With a layer missing")
WITHOUT = {
    "namespaces": "connect to services on this machine's loopback and the network (where seccomp is off too), "
    "and use SysV IPC shared with the trainer",
    "landlock": "read, write and delete every file this user can (your data, keys, checkpoints)",
    "rlimits": "use all the machine's memory, open files (where Landlock is off too) and write large files",
    "seccomp": "start processes and run programs, open sockets, signal or trace other processes",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class SandboxUnavailable(RuntimeError):
    """A kernel layer the sandbox relies on is missing here and the weaker sandbox was not accepted."""


def allow_weaker_from_env() -> bool:
    """SLIMRL_SANDBOX_ALLOW_WEAKER as a bool; ValueError for anything but a clear yes or no."""
    value = os.environ.get(ALLOW_WEAKER_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{ALLOW_WEAKER_ENV}={os.environ[ALLOW_WEAKER_ENV]!r}: use 1 (accept a weaker sandbox) or 0")


def missing(status: dict) -> dict:
    """The kernel layers of `status` (name -> "on ..." / "unavailable: why") that are not on."""
    return {name: status.get(name, "unavailable: not reported") for name in KERNEL_LAYERS
            if not status.get(name, "").startswith("on")}  # fmt: skip


def refusal(gone: dict) -> str:
    lines = [f"- {name}: {state.removeprefix('unavailable: ')}; without it, code past the interpreter filter "
             f"could {WITHOUT[name]}" for name, state in gone.items()]  # fmt: skip
    return (
        "the sandbox refuses to run model-written code: a protection layer is missing on this machine.\n"
        + "\n".join(lines)
        + "\nTo accept the weaker sandbox (docs/sandbox.md says what still holds), set "
        f"Settings(allow_weaker_sandbox=True) (create_locked_down_function(..., allow_weaker_sandbox=True)) or "
        f"{ALLOW_WEAKER_ENV}=1 in the environment."
    )


def enforce(status: dict, allow_weaker: bool) -> None:
    """Raise SandboxUnavailable when a kernel layer is missing and the weaker sandbox is not accepted; warn once
    when it is."""
    accepted = allow_weaker_from_env() or allow_weaker  # a bad value is refused wherever the code runs
    gone = missing(status)
    if not gone:
        return
    if not accepted:
        raise SandboxUnavailable(refusal(gone))
    kept = [name for name in KERNEL_LAYERS if name not in gone]
    notice(
        "sandbox: running model-written code in a weaker sandbox (accepted by allow_weaker_sandbox or "
        f"{ALLOW_WEAKER_ENV}): "
        + "; ".join(f"{name} {state}" for name, state in gone.items())
        + ". Still applied: its own process, the interpreter filter where on"
        + (f", {', '.join(kept)}." if kept else ".")
    )


def verdict(status: dict, allow_weaker: bool = False) -> str:
    """One line: whether model-written code runs here (for `protection()` and `slimrl doctor`)."""
    accepted = allow_weaker_from_env() or allow_weaker
    gone = missing(status)
    if not gone:
        return "runs (every layer on)"
    return (f"runs in a weaker sandbox (accepted): missing {', '.join(gone)}" if accepted
            else f"refused by default: missing {', '.join(gone)}; opt in with {ALLOW_WEAKER_ENV}=1 "
            "or Settings(allow_weaker_sandbox=True)")  # fmt: skip
