"""Mixed-precision flags resolved from the device and the model's dtype (Unsloth's "precision from the model dtype").

TRL sets `bf16=True` whenever the user leaves it unset, and transformers then refuses a CPU-only machine ("Your setup
doesn't support bf16/gpu"). slimrl resolves only the flags the user did not set:

  config time (no model yet): where TRL's own default would fail (bf16 and fp16 unset, no GPU with bf16, use_cpu
  unset), `bf16` becomes False so the config builds, and the config is marked auto. Everywhere TRL's default works
  (a bf16 GPU, or use_cpu=True) it is kept as it is.
  trainer time (model known), auto only:   fp16 weights → fp16 on CUDA;   bf16 or fp32 weights → bf16 on CUDA with
  bf16 support, fp16 on CUDA without it;   CPU → no autocast (fp32 weights train in fp32, bf16 weights in bf16).
  Each flag is written through slimrl.swaps.adjust_default, so only a flag the user did not set changes (the user's
  `fp16=False` with bf16 unset on a GPU without bf16 stays False: the run trains in fp32).

Flags the user did set are never changed: a contradiction with the device or the weights raises, naming the fix.
"""

from __future__ import annotations

import logging

import torch

from ...state import config_state
from ...swaps import adjust_default, set_field

logger = logging.getLogger("slimrl")


def cuda_bf16_supported() -> bool:
    """What slimrl counts as bf16-capable for training: a CUDA GPU with bfloat16 (a CPU needs use_cpu=True)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_config_precision(args) -> None:
    """Called before TRL's `__post_init__`: fill an unset bf16 so the config builds on this device."""
    user_bf16, user_fp16 = args.bf16, bool(args.fp16)
    on_cpu = bool(getattr(args, "use_cpu", False)) or not torch.cuda.is_available()
    state = config_state(args)
    state.auto_precision = False
    if user_bf16 is None and not user_fp16:
        if not cuda_bf16_supported() and not getattr(args, "use_cpu", False):
            state.auto_precision = True
            # bf16=None is TRL's own "not chosen" (a parser passes it as a keyword too): filled, never overridden
            set_field(args, "bf16", False, "bf16 left unset where this device has no bfloat16")
        return
    if user_bf16 and user_fp16:
        raise ValueError("bf16=True and fp16=True were both set: choose one (or leave both unset for slimrl to pick).")
    if user_bf16 and not getattr(args, "use_cpu", False) and not cuda_bf16_supported():
        where = "this GPU has no bf16 support" if torch.cuda.is_available() else "no GPU is available"
        raise ValueError(
            f"bf16=True but {where}. Leave `bf16` unset (slimrl then picks the precision from the model), set "
            "bf16=False, or set use_cpu=True to train with bf16 autocast on the CPU."
        )
    if user_fp16 and on_cpu:
        raise ValueError(
            "fp16=True needs a CUDA GPU (fp16 mixed precision does not run on the CPU). Leave `fp16` unset, or set "
            "fp16=False."
        )


def model_dtype(model) -> torch.dtype:
    """dtype of the model's floating-point weights (the base weights under PEFT; compute dtype when 4-bit)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quant = getattr(getattr(base, "config", None), "quantization_config", None)
    compute = getattr(quant, "bnb_4bit_compute_dtype", None) if quant is not None else None
    if compute is not None and not isinstance(compute, str):
        return compute
    for p in base.parameters():
        if p.is_floating_point() and not p.requires_grad:
            return p.dtype
    for p in base.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def resolve_trainer_precision(args, model) -> None:
    """Called before the trainer builds its Accelerator: check explicit flags against the weights, resolve auto ones."""
    dtype = model_dtype(model)
    if not config_state(args).auto_precision:
        if args.fp16 and dtype == torch.bfloat16:
            raise ValueError(
                "fp16=True but the model's weights are bfloat16: set bf16=True and fp16=False, or load the model "
                "with dtype=torch.float16."
            )
        if args.bf16 and dtype == torch.float16:
            raise ValueError(
                "bf16=True but the model's weights are float16: set fp16=True and bf16=False, or load the model "
                "with dtype=torch.bfloat16."
            )
        return
    on_cuda = torch.cuda.is_available() and not getattr(args, "use_cpu", False)
    if not on_cuda:
        bf16, fp16 = False, False
    elif dtype == torch.float16:
        bf16, fp16 = False, True
    elif cuda_bf16_supported():
        bf16, fp16 = True, False
    else:
        bf16, fp16 = False, True
    why = "bf16/fp16 left unset: the precision of the model's weights on this device"
    changed = [adjust_default(args, name, bool(value), why) for name, value in (("bf16", bf16), ("fp16", fp16))]
    if any(changed):
        set_field(args, "mixed_precision", "bf16" if args.bf16 else "fp16" if args.fp16 else "no", why)
    logger.info(
        "slimrl: precision from the model (%s weights, %s): bf16=%s, fp16=%s (set bf16/fp16 yourself to override)",
        str(dtype).replace("torch.", ""),
        "CUDA" if on_cuda else "CPU",
        args.bf16,
        args.fp16,
    )
