"""slimrl.training.cpu_heap: glibc's mmap threshold set once per process for CPU training, never over a user's own
setting, never on an accelerator or another C library. The C library is a fake here (the calls it got recorded), so
the test process's malloc is left as it is, except in the one test that checks the real glibc answers."""

from __future__ import annotations

import sys

import pytest
import torch

from slimrl.swaps import run_values
from slimrl.training import cpu_heap


class FakeLibc:
    def __init__(self, answer: int = 1):
        self.calls, self.answer = [], answer
        self.mallopt = self._mallopt

    def _mallopt(self, param, value):
        self.calls.append((param, value))
        return self.answer


@pytest.fixture
def libc(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(cpu_heap, "_glibc", lambda: fake)
    for var in (cpu_heap.OPT_OUT_VAR, *cpu_heap.USER_VARS, "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    before = cpu_heap.HEAP.get()
    cpu_heap.HEAP.set(None)
    yield fake
    cpu_heap.HEAP.set(before)


def test_applied_once_on_cpu_with_a_notice_and_in_describe(libc, monkeypatch):
    said = []
    monkeypatch.setattr(cpu_heap, "notice", said.append)
    assert cpu_heap.apply(torch.device("cpu")) is True
    assert cpu_heap.apply(torch.device("cpu")) is False  # a second trainer in the same process
    assert libc.calls == [(cpu_heap.M_MMAP_THRESHOLD, 1 << 20)]
    assert cpu_heap.M_MMAP_THRESHOLD == -3
    assert len(said) == 1 and "mmap threshold set to 1 MiB" in said[0] and "SLIMRL_CPU_HEAP=keep" in said[0]
    assert run_values(changed_only=True)["cpu_heap"][1] == "M_MMAP_THRESHOLD=1 MiB"


@pytest.mark.parametrize(
    "var, value",
    [
        ("MALLOC_MMAP_THRESHOLD_", "65536"),
        ("SLIMRL_CPU_HEAP", "keep"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4096"),
    ],
)
def test_a_users_setting_or_the_opt_out_wins(libc, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert cpu_heap.skip_reason("cpu") is not None
    assert cpu_heap.apply(torch.device("cpu")) is False
    assert libc.calls == [] and cpu_heap.HEAP.get() is None
    assert "cpu_heap" not in run_values(changed_only=True)


def test_unrelated_tunables_do_not_count_as_a_users_threshold(libc, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert cpu_heap.apply("cpu") is True and len(libc.calls) == 1


@pytest.mark.parametrize("device", [torch.device("cuda", 0), torch.device("xpu"), "mps"])
def test_not_on_an_accelerator(libc, device):
    assert cpu_heap.apply(device) is False
    assert libc.calls == [] and cpu_heap.HEAP.get() is None


def test_not_where_glibc_refuses(libc):
    libc.answer = 0
    assert cpu_heap.apply("cpu") is False and cpu_heap.HEAP.get() is None


def test_no_op_without_glibc(libc, monkeypatch):
    monkeypatch.setattr(cpu_heap, "_glibc", lambda: None)
    assert cpu_heap.apply("cpu") is False and cpu_heap.HEAP.get() is None


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_glibc_only_on_linux(monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)
    assert cpu_heap._glibc() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc is a Linux C library")
def test_the_real_glibc_is_found_here():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")
    libc = cpu_heap._glibc()
    assert libc is not None and hasattr(libc, "mallopt")
