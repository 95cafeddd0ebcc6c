"""The CPU heap: glibc malloc's mmap threshold set to 1 MiB once per process when a patched trainer runs on the CPU.

Why: glibc serves a block above its mmap threshold with its own `mmap` and gives it back to the kernel on `free`;
below it, the block comes from the heap (an arena), and a freed arena block stays in the process's memory for the
next allocation. The default threshold starts at 128 KiB but grows to the size of every mmapped block freed (up to
32 MiB on 64-bit), so after the first step's log-prob tiles, activations and LoRA gradients are freed, the next
ones of that size come from the arena, and the arena keeps the high-water mark of every phase. A fixed 1 MiB
threshold (`mallopt(M_MMAP_THRESHOLD, 1 MiB)`, which also turns the growth off) hands each large tensor back when
torch frees it: one GRPO policy step's working memory falls by an order of magnitude (docs/memory.md, "The CPU heap").

When: on the first patched trainer whose accelerator device is the CPU (trainer_setup.py's `_after_init`), on Linux
with glibc only; nothing on CUDA/XPU/MPS, on musl, macOS or Windows. A user's own setting wins: with
`MALLOC_MMAP_THRESHOLD_` in the environment, or `mmap_threshold` in `GLIBC_TUNABLES`, slimrl leaves the threshold as
glibc took it from there. `SLIMRL_CPU_HEAP=keep` opts out. Applied, it says so in one line and `slimrl.describe`
lists it (the run-time value `cpu_heap`).
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..notices import notice
from ..planning.terms import HEAP_LIMIT
from ..swaps import ProcessValue

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD_BYTES = HEAP_LIMIT  # the planner's heap limit (planning/terms.py) is this setting
OPT_OUT_VAR, OPT_OUT_VALUE = "SLIMRL_CPU_HEAP", "keep"
USER_VARS = ("MALLOC_MMAP_THRESHOLD_",)

HEAP = ProcessValue("cpu_heap", None, "glibc malloc's mmap threshold, set for CPU training (training/cpu_heap.py)")


def _glibc():
    """The C library as a ctypes handle when it is glibc on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return libc


def skip_reason(device_type: str) -> str | None:
    """Why the threshold is left as it is for a trainer on `device_type`, or None when slimrl sets it."""
    if device_type != "cpu":
        return f"the trainer runs on {device_type}"
    if os.environ.get(OPT_OUT_VAR, "").strip().lower() == OPT_OUT_VALUE:
        return f"{OPT_OUT_VAR}={OPT_OUT_VALUE}"
    for var in USER_VARS:
        if var in os.environ:
            return f"{var} is set"
    if "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets mmap_threshold"
    return None


def apply(device) -> bool:
    """Set the threshold for this process if a trainer on `device` should have it and no one has; True if set now."""
    if HEAP.get() is not None:
        return False
    device_type = getattr(device, "type", str(device))
    if skip_reason(device_type) is not None:
        return False
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES) != 1:
        return False
    HEAP.set(f"M_MMAP_THRESHOLD={THRESHOLD_BYTES >> 20} MiB")
    notice(
        f"CPU training: glibc malloc's mmap threshold set to {THRESHOLD_BYTES >> 20} MiB, so freed tensors go back "
        f"to the system instead of staying in the heap ({OPT_OUT_VAR}={OPT_OUT_VALUE} keeps glibc's default)."
    )
    return True
