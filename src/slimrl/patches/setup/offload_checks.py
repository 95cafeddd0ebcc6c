"""Host memory for activation offload, checked at trainer set-up, before the first step.

use_gradient_checkpointing="offload" keeps each checkpointed layer input in a host buffer (slimrl.models.offload);
CUDA's are pinned, so the kernel can neither swap nor reclaim them, and a step whose buffers outgrow the machine's
free memory fails mid-step (or takes the machine down with it). Choices:
1. The figure is the plan's (slimrl.planning.terms.offload_host_bytes, its one owner): the layers but the newest,
   each a power-of-two buffer of one policy forward's block input, rows x (prompt + completion) x H x a bytes, rows
   being a row group's where the step is scored in groups. Lengths are the plan's worst cases (every completion
   max_completion_length long, prompts `max_seq_length - max_completion_length` or 512 tokens).
2. Available memory: /proc/meminfo's MemAvailable (what can be allocated without swapping), else the free pages.
3. Checked where the offload moves anything (slimrl.models.checkpointing.resolve_checkpointing decides): a model on
   a CUDA device, or an offloader set to move host tensors (configure_offload(host_tensors=True)); a CPU run's
   offload moves nothing and is not checked. Trainers the planner does not know (SFT and others) are not checked.
4. Too little: ValueError naming both figures and the remedies (fewer rows per group, shorter completions,
   offload off). Offload stays opt-in: the plan names it among the settings that fit when it is one.
"""

from __future__ import annotations

import os

from ...memory import gib

MEMINFO = "/proc/meminfo"


def _size(n: int) -> str:
    return f"{gib(n):.2f} GiB" if n >= 2**30 // 10 else f"{n / 2**20:.1f} MiB"


def available_host_bytes() -> int:
    """Host memory that can be allocated without swapping (MemAvailable; the free pages where there is none)."""
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _offload_moves(model, offloader, mode) -> bool:
    """Whether the model's `mode` moves layer inputs (slimrl.models.checkpointing.resolve_checkpointing decides)."""
    from ...models.checkpointing import resolve_checkpointing

    device = "cuda" if any(p.device.type == "cuda" for p in model.parameters()) else "cpu"
    host_tensors = offloader is not None and offloader.host_tensors
    return resolve_checkpointing(mark=mode, device=device, host_tensors=host_tensors).moves


def offload_host_need(model, args, offloader=None) -> tuple[int, str] | None:
    """(bytes, how they were counted) the offloaded layer inputs of one step need, or None where not checked."""
    from ...planning.run import CONFIG_CLASSES, algorithm_of, run_shape
    from ...planning.terms import offload_host_bytes, policy_tokens

    algorithm = algorithm_of(args)
    if algorithm not in CONFIG_CLASSES:
        return None
    config = model.config.get_text_config()
    dtype = str(getattr(model, "dtype", "float32"))
    max_seq_length = getattr(model, "max_seq_length", None)  # FastLanguageModel's, as `slimrl plan` reads it
    run = run_shape(algorithm, args, dtype=dtype, device="cuda", max_seq_length=max_seq_length)
    tokens = policy_tokens(run)
    settings = {} if offloader is None else dict(keep_last=offloader.keep_last, min_bytes=offloader.min_bytes)
    part = offload_host_bytes(config.num_hidden_layers, config.hidden_size, run.act_bytes, tokens, **settings)
    rows = f"{run.policy_rows} rows x ({run.prompt_length:,} + {run.completion_length:,}) tokens"
    return part.bytes, f"{part.formula}; {tokens:,} tokens = {rows}"


def check_offload_host_memory(model, args, offloader=None, available: int | None = None, mode="offload") -> None:
    """Raise ValueError when the offloaded layer inputs of a step would not fit the host's available memory (the
    model's checkpointing `mode`: none to check unless it is an "offload" that moves anything)."""
    if not _offload_moves(model, offloader, mode):
        return
    need = offload_host_need(model, args, offloader)
    if need is None or not need[0]:
        return
    needed, how = need
    available = available_host_bytes() if available is None else available
    if needed <= available:
        return
    field = "max_completion_length" if hasattr(args, "max_completion_length") else "max_length"
    raise ValueError(
        f"activation offload needs {_size(needed)} of host memory for the layer inputs of one step ({how}), "
        f"but this machine has {_size(available)} available. Use fewer rows per group "
        f"(slimrl_rows_per_group=1, or a smaller per_device_train_batch_size), shorter completions ({field}), or "
        "turn offload off (use_gradient_checkpointing=True keeps the layer inputs on the device)."
    )


def check_trainer_offload(trainer) -> None:
    """The check above for a trainer whose model runs the "offload" mode (trainer set-up, after TRL's `__init__`)."""
    from ...models.checkpointing import base_transformers_model, checkpointing_mode
    from ...state import model_state

    state = model_state(base_transformers_model(trainer.model), create=False)
    offloader = getattr(state, "offloader", None)
    check_offload_host_memory(trainer.model, trainer.args, offloader, mode=checkpointing_mode(trainer.model))
