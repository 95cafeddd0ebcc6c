"""On a machine that lacks a kernel layer of the sandbox (no Landlock, user namespaces refused), the sandbox refuses
model-written code by default. Tests of what the sandbox does (not of that refusal) then accept the weaker sandbox
explicitly, through its environment variable: `accept_weaker_sandbox_if_missing(monkeypatch)`. Where every layer is
on, nothing changes. test_sandbox_fail_closed.py and the catalogue set or clear the opt-in themselves."""

import functools


@functools.cache
def missing_here() -> tuple[str, ...]:
    """The kernel layers this machine lacks (one sandbox process is started to find out)."""
    from slimrl.sandbox import layers, protection

    return tuple(layers.missing(protection()))


def accept_weaker_sandbox_if_missing(monkeypatch) -> None:
    from slimrl.sandbox import ALLOW_WEAKER_ENV

    if missing_here():
        monkeypatch.setenv(ALLOW_WEAKER_ENV, "1")
