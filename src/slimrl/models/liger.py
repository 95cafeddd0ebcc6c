"""Liger-Kernel's RMSNorm, RoPE and SwiGLU on a CUDA model (the optional `gpu` extra), recorded and reversible.

`apply_liger(model, setting="auto")` runs liger-kernel's `apply_liger_kernel_to_<model_type>(model=...)` with
`rope`, `rms_norm` and `swiglu` on and `cross_entropy` / `fused_linear_cross_entropy` off (TRL's log-prob head is
kept), and records every change it made through slimrl.swaps, so `slimrl.describe(model)` lists them;
`restore_liger(model)` undoes them. FastLanguageModel.get_peft_model applies it with its `liger_kernel` keyword.

Choices, and why:
1. Setting: "auto" (default) applies the kernels when the model's parameters are on CUDA and liger-kernel is
   installed; on CPU (Liger's kernels are Triton: GPU only), without liger-kernel or for an architecture Liger has no
   function for, nothing changes and one notice says why (once per process). True raises there instead, naming
   `pip install slimrl[gpu]`; False leaves the model alone. An installed liger-kernel outside
   versions.EXTRAS_SUPPORTED raises either way, naming both.
2. Recording: Liger's functions write module attributes and instance attributes themselves. The own attributes of
   every loaded transformers module and of every submodule of the model are read before and after the call; each
   one that changed is recorded (swaps.adopt) with the value before it, so `restore` puts back exactly what was
   there (an added one removed).
3. Module level: Liger also replaces a modeling module's classes (`Qwen2RMSNorm`, `Qwen2MLP`) and its rotary
   function, which are process-wide. The classes are put back at once (the live model's instances are patched; a
   model built later, maybe on CPU, gets the eager classes). The rotary function becomes a dispatcher
   (`OnCuda`): Liger's kernel for CUDA tensors, the original otherwise, so a CPU model of the same architecture
   keeps working (and a CUDA one, even with liger_kernel=False, runs Liger's RoPE: the same math). It stays until
   `restore_liger` of any model takes it off (other models keep their Liger norms and MLPs and run the eager RoPE
   again).
4. Only get_peft_model applies it (full fine-tuning without LoRA does not, yet); pickling a model with these swaps
   keeps the record and `restore_liger` works on the copy (swaps.MISSING is one object through pickle and deepcopy),
   but an unpickled model runs the eager forwards (pickle rebinds a method by name, before the instance's own
   attributes are back); `copy.deepcopy` keeps Liger's forwards.
"""

from __future__ import annotations

import importlib
import sys
import types

from .. import swaps, versions
from ..notices import notice
from ..state import SWAPS_ATTR, transformers_model
from .lora_speed import AUTO, on_cuda, validate_lever

PACKAGE = "liger-kernel"
INSTALL = "pip install slimrl[gpu]"
WHY = "Liger-Kernel RMSNorm / SwiGLU (models/liger.py)"
ROPE_WHY = "Liger-Kernel RoPE on CUDA tensors, the original elsewhere (models/liger.py)"
_RESTORED_WHY = "Liger-Kernel's module-level class, put back at once (models/liger.py)"
LIGER_ARGS = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)


class OnCuda:
    """A module-level function that calls `cuda` on CUDA tensors and `original` otherwise (a process-wide swap)."""

    def __init__(self, original, cuda):
        self.original, self.cuda = original, cuda
        self.__name__ = getattr(original, "__name__", "on_cuda")
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, *args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()), None)
        return (self.cuda if getattr(first, "is_cuda", False) else self.original)(*args, **kwargs)


def _apply_function(model_type: str):
    module = importlib.import_module("liger_kernel.transformers")
    return getattr(module, f"apply_liger_kernel_to_{model_type}", None)


def why_not(on_cuda: bool, model_type: str | None) -> str | None:
    """Why the kernels do not apply (None: they do); raises ImportError for a liger-kernel outside its range."""
    version = versions.installed(PACKAGE)
    if version is not None:
        versions.check({PACKAGE: versions.EXTRAS_SUPPORTED[PACKAGE]}, "liger_kernel")
    if not on_cuda:
        return "the model is not on CUDA (Liger's kernels are Triton: GPU only)"
    if version is None:
        return f"liger-kernel is not installed ({INSTALL})"
    if model_type is None or _apply_function(model_type) is None:
        return f"liger-kernel has no kernels for model type {model_type!r}"
    return None


def _transformers_modules() -> list:
    """The loaded modules of transformers (where Liger's functions write module-level names)."""
    return [m for name, m in list(sys.modules.items()) if name.startswith("transformers.") and m is not None]


def _snapshot(model) -> dict:
    return {id(obj): (obj, dict(vars(obj))) for obj in (*_transformers_modules(), *model.modules())}


def _record(before: dict) -> None:
    """Record every own attribute that changed since `before` (module-level classes put back at once)."""
    for obj, old in before.values():
        for name, value in list(vars(obj).items()):
            original = old.get(name, swaps.MISSING)
            if name == SWAPS_ATTR or original is value:
                continue
            if not isinstance(obj, types.ModuleType):
                swaps.adopt(obj, name, original, WHY)
                continue
            swaps.adopt(obj, name, original, _RESTORED_WHY)
            swaps.restore(obj, name)
            if callable(original) and not isinstance(original, type) and not isinstance(original, OnCuda):
                swaps.swap(obj, name, OnCuda(original, value), ROPE_WHY)


def kernels_on(model) -> int:
    """How many submodules of `model` run a Liger kernel (their forward swapped by apply_liger)."""
    return sum(swaps.latest_why(m, "forward") == WHY for m in transformers_model(model).modules())


def apply_liger(model, setting=AUTO):
    """Apply Liger-Kernel's RMSNorm, RoPE and SwiGLU to `model` per `setting` (module docstring); returns `model`.
    Idempotent; a PeftModel reaches the transformers model under it."""
    setting = validate_lever("liger_kernel", setting)
    if setting is False or kernels_on(model):
        return model
    target = transformers_model(model)
    model_type = getattr(getattr(target, "config", None), "model_type", None)
    reason = why_not(on_cuda(target), model_type)
    if reason is not None:
        if setting is True:
            raise RuntimeError(
                f"liger_kernel=True, but {reason}. Liger-Kernel needs a model on CUDA and `{INSTALL}`; "
                "liger_kernel='auto' skips it where it cannot apply."
            )
        notice(f"Liger-Kernel not applied (liger_kernel='auto'): {reason}.")
        return model
    before = _snapshot(target)
    _apply_function(model_type)(model=target, **LIGER_ARGS)
    _record(before)
    return model


def restore_liger(model):
    """Undo apply_liger on `model` (and the process-wide RoPE dispatcher); returns `model`."""
    target = transformers_model(model)
    for obj in target.modules():
        for name in list(swaps.swapped(obj)):
            while swaps.latest_why(obj, name) == WHY:
                swaps.restore(obj, name)
    for module in _transformers_modules():
        for name in list(swaps.swapped(module)):
            while swaps.latest_why(module, name) == ROPE_WHY:
                swaps.restore(module, name)
    return model


def plan_line(device: str, model_type: str | None) -> str:
    """The plan's line on Liger-Kernel with the default liger_kernel='auto' (never raises)."""
    try:
        reason = why_not(device == "cuda", model_type)
    except ImportError as error:
        reason = str(error).split(". Install", 1)[0]
    if reason is None:
        return f"Liger-Kernel RMSNorm, RoPE and SwiGLU apply (liger-kernel {versions.installed(PACKAGE)}, CUDA)"
    return f"Liger-Kernel does not apply: {reason}"
