"""Peak-memory readings that can be reset between steps: CUDA's allocator stats, or the process's RSS high-water mark.

On Linux, writing "5" to /proc/self/clear_refs resets VmHWM (the peak resident set) so each training step reports its
own peak instead of the process's lifetime peak that `ru_maxrss` gives.
"""

from __future__ import annotations

import resource
import sys

import torch

_GIB = 1024**3


def _use_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def reset_peak_memory(device: torch.device | str | None = None) -> None:
    if _use_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not permitted: the reading stays a lifetime peak
        pass


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_memory_bytes(device: torch.device | str | None = None) -> int:
    if _use_cuda(device):
        return torch.cuda.memory_allocated(device)
    kib = _proc_status_kib("VmRSS")
    return 0 if kib is None else kib * 1024


def peak_memory_bytes(device: torch.device | str | None = None) -> int:
    """CUDA: max allocated since the last reset. CPU: peak RSS since the last reset (lifetime where unsupported)."""
    if _use_cuda(device):
        return torch.cuda.max_memory_allocated(device)
    kib = _proc_status_kib("VmHWM")
    if kib is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss if sys.platform == "darwin" else maxrss * 1024
    return kib * 1024


def gib(n_bytes: int) -> float:
    return n_bytes / _GIB
