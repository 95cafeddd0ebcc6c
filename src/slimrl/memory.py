"""Memory readings for the `peak_memory_gb` metric and the memory budget: read, never reset.

The process's peak counters belong to the user: slimrl never resets them, so a user's own whole-run reading
(`torch.cuda.max_memory_allocated()`, VmHWM in /proc/self/status) is the same with slimrl as without it.

- `peak_memory_bytes`: the high-water mark now. CUDA: `torch.cuda.max_memory_allocated` (the allocator's peak since
  the process started, or since the user's last `torch.cuda.reset_peak_memory_stats()`). CPU: VmHWM, the peak
  resident set (since the process started, or since the user's last write of "5" to /proc/self/clear_refs);
  `ru_maxrss` where /proc is missing.
- `StepPeak`: one training step's reading without a reset. It reads the mark and the memory in use before and after
  the step. A mark that rose during the step is that step's own peak, exactly (the step set the highest value since
  the counter's start). A mark that did not rise says only that the step stayed at or below the earlier peak; what
  is then known of the step is the memory in use at its start and end (a lower bound of its peak).
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch

_GIB = 1024**3


def _use_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


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
    """The high-water mark now (module docstring); reading it changes nothing."""
    if _use_cuda(device):
        return torch.cuda.max_memory_allocated(device)
    kib = _proc_status_kib("VmHWM")
    if kib is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss if sys.platform == "darwin" else maxrss * 1024
    return kib * 1024


@dataclass(frozen=True)
class StepPeak:
    """The high-water mark and the memory in use, before and after one step (bytes)."""

    before: int
    after: int
    in_use_before: int = 0
    in_use_after: int = 0

    @property
    def rose(self) -> bool:
        """The step set a new high: `after` is then exactly the step's own peak."""
        return self.after > self.before

    @property
    def known_bytes(self) -> int:
        """What the step is known to have reached: its peak where the mark rose, else the memory in use at its start
        or end, whichever is larger (a lower bound of its peak)."""
        return self.after if self.rose else max(self.in_use_before, self.in_use_after)


def measure_step(run, device: torch.device | str | None = None):
    """`run()`, and the StepPeak around it: (its result, StepPeak)."""
    before, in_use_before = peak_memory_bytes(device), current_memory_bytes(device)
    result = run()
    return result, StepPeak(before, peak_memory_bytes(device), in_use_before, current_memory_bytes(device))


def gib(n_bytes: int) -> float:
    return n_bytes / _GIB
