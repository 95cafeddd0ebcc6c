"""The patched configs under a multi-process launch on a machine without an accelerator (`use_cpu`).

slimrl brings no distribution of its own: TRL runs on accelerate (DDP, FSDP2, DeepSpeed ZeRO, several nodes) and the
patched trainers keep it. One default goes wrong there, and it is resolved the way precision.py resolves bf16:

1. On a machine with no accelerator, transformers joins the processes torchrun started (`WORLD_SIZE` > 1) into one
   gloo process group only when `use_cpu=True` (accelerate's `PartialState(cpu=True)`); with TRL's default
   (`use_cpu=False`) each process counts a world of 1 and trains alone on its own copy of the model, and GRPO's
   `generation_batch_size` is computed for one process ("generation_batch_size (2) must be divisible by
   num_generations (4)" on per-device batch 2 x 2 processes, G=4). Stock TRL behaves the same.
2. `use_cpu` left unset there becomes True, with a one-line notice naming the old and the new value (rank 0 only,
   once per config). A single process is left alone: `use_cpu` changes nothing there, and its numbers stay stock's.
3. `use_cpu=False` set by the user there raises: the value cannot hold without running N unsynchronised trainings
   that all write the same output_dir, and slimrl never changes a value the user set.
4. It runs after precision's resolution, so an unset bf16 resolves as on any CPU run (no autocast), not as stock's
   `use_cpu=True` default (bf16 autocast).
5. FSDP asked for in a multi-process CPU run (accelerate's FSDP config, or the config's `fsdp`; with use_cpu set or
   resolved) raises: accelerate applies FSDP only to accelerator process groups, and the CPU processes would
   silently train plain DDP instead. DeepSpeed ZeRO runs on
   the CPU (its CPU accelerator, gloo) and goes ahead.
6. "An accelerator" is whatever torch counts (`torch.accelerator`: CUDA, XPU, MPS, ...) or an XLA device: there the
   launcher's own backend applies and nothing is changed. `ACCELERATE_USE_CPU=true` (set by `accelerate launch
   --cpu`) already means use_cpu to transformers.
7. With no accelerator (or use_cpu), `dataloader_pin_memory` left unset becomes False (recorded, no notice): pinned
   host memory has nothing to be copied to, and torch warns about it at every dataloader, mid-progress-bar. A value
   the user set is kept.
"""

from __future__ import annotations

import os

import torch

from ...notices import notice
from ...swaps import adjust_default

# The variables accelerate reads for a launch's world size (torchrun, Intel MPI / MPICH, Open MPI, MVAPICH)
WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes() -> int:
    """How many processes the launcher started (1 without a launcher)."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(list(WORLD_SIZE_VARS), 1)


def has_accelerator() -> bool:
    if torch.accelerator.is_available():
        return True
    from accelerate.utils import is_torch_xla_available

    return is_torch_xla_available()


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def uses_fsdp(args) -> bool:
    """FSDP asked for, in the config or by `accelerate launch` with an FSDP config."""
    return bool(getattr(args, "fsdp", None)) or _flag("ACCELERATE_USE_FSDP")


def resolve_config_device(args) -> None:
    """In the config's `__post_init__`, after precision, before TRL's: `use_cpu` for a multi-process CPU launch."""
    if getattr(args, "use_cpu", None) is None:
        return
    processes = launched_processes()
    cpu_asked = bool(args.use_cpu) or _flag("ACCELERATE_USE_CPU")
    if processes < 2 or not (cpu_asked or not has_accelerator()):
        return
    if uses_fsdp(args):
        raise ValueError(
            f"FSDP was asked for, but the {processes} processes train on CPUs: accelerate applies FSDP only to GPU "
            "(XPU, ...) process groups, so they would train plain DDP instead. Drop the FSDP config (DDP), use "
            "DeepSpeed ZeRO (it runs on CPUs), or run on GPUs."
        )
    if cpu_asked:
        return
    if not adjust_default(args, "use_cpu", True, "several processes on a machine without an accelerator"):
        raise ValueError(
            f"use_cpu=False, but this machine has no accelerator and the launcher started {processes} processes: "
            "transformers joins CPU processes into one group only with use_cpu=True, so each process would train "
            "alone on its own copy. Set use_cpu=True (or leave it unset), or launch a single process."
        )
    if os.environ.get("RANK", "0") == "0":
        notice(
            f"use_cpu=True (was False): {processes} processes on a machine without an accelerator "
            "(set use_cpu yourself to silence this)"
        )


def resolve_pin_memory(args) -> None:
    """In the config's `__post_init__`: `dataloader_pin_memory` off without an accelerator, unless the user set it."""
    if not getattr(args, "dataloader_pin_memory", False):
        return
    if getattr(args, "use_cpu", False) or _flag("ACCELERATE_USE_CPU") or not has_accelerator():
        adjust_default(args, "dataloader_pin_memory", False, "no accelerator: pinned host memory would go unused")
