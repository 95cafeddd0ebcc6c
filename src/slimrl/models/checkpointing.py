"""Activation (gradient) checkpointing modes for slimrl models, pinned so TRL and transformers cannot change them.

Modes, recorded on the transformers model (slimrl.state.ModelState.checkpointing; reached through a PeftModel too):
  False      no checkpointing.
  True       non-reentrant `torch.utils.checkpoint` around every decoder layer (transformers' own mechanism).
  "offload"  the same, and the layer inputs that checkpointing keeps for the recompute wait in host memory
             (slimrl.models.offload: side copy stream, pinned buffer pool, prefetch, newest input kept on the
             device). "unsloth" is an alias.

Choices:
- Offloading uses our own checkpoint function instead of transformers'
  `activation_checkpointing_enable(offload=True)`. Both rely on the same fact: non-reentrant checkpointing saves the
  layer inputs through autograd's saved-tensor hooks (`_NoopSaveInputs.save_for_backward`), so an outer hook sees
  them and can move them. But transformers wraps the call in `save_on_cpu(pin_memory=True)`, which copies on the
  compute stream (the step waits for every copy), allocates host memory every step, moves the last layer's input
  out and straight back, and raises on a CPU-only torch build. Ours (slimrl.models.offload) copies beside the
  compute and leaves host tensors where they are, so on a CPU-only machine "offload" costs what True costs and
  gives the same numbers.
- One ActivationOffloader per model (ModelState.offloader), made when "offload" is first enabled and kept through
  every later enable, so its host buffers are reused from step to step; `configure_offload` changes its settings.
- The mode must survive the places that re-enable checkpointing themselves: `Trainer.__init__`
  (`activation_checkpointing_enable(offload=False)` when `args.gradient_checkpointing`), TRL's
  `unwrap_model_for_generation` and `disable_gradient_checkpointing` (disable, then
  `gradient_checkpointing_enable(kwargs)`). We set an instance-level `gradient_checkpointing_enable` on the
  transformers model (as TRL's selective checkpointing does); transformers' `_is_overridden` then routes
  `activation_checkpointing_enable` through it too, and PeftModel forwards both names to the base model. The
  wrapper enables the model's own mode whatever the caller asked; mode False turns enables into no-ops (warned
  once). It is a bound method (`types.MethodType`) so `copy.deepcopy` rebinds it to the copy.
- The input-embedding `requires_grad` hook (without it LoRA in layer 0 gets no gradient under checkpointing) is
  registered once; transformers' enable registers another one on every call.
"""

from __future__ import annotations

import functools
import logging
import types

import torch
from torch.utils.checkpoint import checkpoint

from ..state import model_state, transformers_model
from .offload import ActivationOffloader

logger = logging.getLogger("slimrl")

MODES = (False, True, "offload")
_ALIASES = {"unsloth": "offload", "offload": "offload", "true": True, "false": False, "none": False}


def normalize_mode(value) -> bool | str:
    """Map a user's `use_gradient_checkpointing` value to False, True or "offload"."""
    if value is None or value is False:
        return False
    if value is True:
        return True
    if isinstance(value, str) and value.lower() in _ALIASES:
        return _ALIASES[value.lower()]
    raise ValueError(f"use_gradient_checkpointing must be True, False, 'offload' or 'unsloth', not {value!r}")


base_transformers_model = transformers_model  # the transformers model under a PeftModel (or the model itself)


def offloaded_checkpoint(offloader: ActivationOffloader, checkpoint_kwargs: dict, function, *args, **kwargs):
    """`torch.utils.checkpoint.checkpoint` with the saved layer inputs handled by `offloader`."""
    with torch.autograd.graph.saved_tensors_hooks(offloader.pack, offloader.unpack):
        return checkpoint(function, *args, **checkpoint_kwargs, **kwargs)


def configure_offload(model, *, min_bytes: int | None = None, keep_last: int | None = None, host_tensors=None):
    """Settings of the model's activation offload (used when its mode is "offload"); None leaves one as it is.

    min_bytes: layer inputs smaller than this stay on the device (default 1 MiB). keep_last: how many of the newest
    layer inputs stay on the device (default 1). host_tensors: also send inputs that already live in host memory
    through the offload path (CPU runs; only useful to exercise that path). Returns the model's ActivationOffloader.
    """
    offloader = _offloader(model_state(base_transformers_model(model)))
    offloader.configure(min_bytes, keep_last, host_tensors)
    return offloader


def _offloader(state) -> ActivationOffloader:
    """The model's one offloader, made on first use (its host pool then lives as long as the model)."""
    if state.offloader is None:
        state.offloader = ActivationOffloader()
    return state.offloader


def _checkpoint_kwargs(kwargs: dict | None) -> dict:
    kwargs = dict(kwargs or {})
    for key in ("offload", "every_n_layers", "selective"):  # trainer/TRL keys torch's checkpoint does not accept
        kwargs.pop(key, None)
    kwargs.setdefault("use_reentrant", False)  # offloading needs the saved-tensor path of non-reentrant checkpointing
    return kwargs


def _enable_input_grads_once(base) -> None:
    if base.main_input_name != "input_ids" or getattr(base, "_require_grads_hooks", None):
        return
    base.enable_input_require_grads()


def _enable(base, mode, checkpoint_kwargs: dict | None = None, every_n_layers: int = 1) -> None:
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    kwargs = _checkpoint_kwargs(checkpoint_kwargs)
    state = model_state(base)
    if mode == "offload":
        func = functools.partial(offloaded_checkpoint, _offloader(state), kwargs)
    else:
        func = functools.partial(checkpoint, **kwargs)
    base._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=func, every_n_layers=every_n_layers)
    state.checkpoint_args = (checkpoint_kwargs, every_n_layers)  # reused when for_training switches it back on
    _enable_input_grads_once(base)


def _disable(base) -> None:
    if getattr(base, "supports_gradient_checkpointing", False):
        base._set_gradient_checkpointing(enable=False)


def _pinned_gradient_checkpointing_enable(
    self, gradient_checkpointing_kwargs=None, every_n_layers=1, offload=False, **_ignored
):
    """Instance override of `gradient_checkpointing_enable`: enables the model's slimrl mode, whatever was asked."""
    state = model_state(self)
    mode = state.checkpointing or False
    if mode is False:
        if "checkpointing disabled" not in state.warned:
            state.warned.add("checkpointing disabled")
            logger.warning(
                "Gradient checkpointing was requested (e.g. the trainer's `gradient_checkpointing=True`) but the model "
                "was set up with use_gradient_checkpointing=False; keeping it off. Set "
                "`gradient_checkpointing=False` in the trainer config to silence this."
            )
        return
    if offload and mode != "offload" and "offload not configured" not in state.warned:
        state.warned.add("offload not configured")
        logger.warning(
            "`activation_checkpointing_kwargs['offload']=True` was asked but the model was set up with "
            "use_gradient_checkpointing=%r; keeping %r (use use_gradient_checkpointing='offload').",
            mode,
            mode,
        )
    _enable(self, mode, gradient_checkpointing_kwargs, every_n_layers)


def _install_guard(base) -> None:
    current = base.__dict__.get("gradient_checkpointing_enable")
    if current is not None and getattr(current, "__func__", None) is _pinned_gradient_checkpointing_enable:
        return
    base.gradient_checkpointing_enable = types.MethodType(_pinned_gradient_checkpointing_enable, base)


def apply_checkpointing(model, mode, checkpoint_kwargs: dict | None = None, every_n_layers: int = 1):
    """Configure and switch on checkpointing `mode` (False | True | "offload" | "unsloth") on `model`.

    Works on a transformers model or a PeftModel (the mode is stored on the transformers model's ModelState) and pins
    the mode against later enables from Trainer/TRL. Idempotent; returns `model`.
    """
    mode = normalize_mode(mode)
    base = base_transformers_model(model)
    model_state(base).checkpointing = mode
    _install_guard(base)
    if mode is False:
        _disable(base)
    else:
        _enable(base, mode, checkpoint_kwargs, every_n_layers)
    return model


def checkpointing_mode(model):
    """The configured slimrl mode (False | True | "offload"), or None if slimrl never configured one."""
    state = model_state(model, create=False)
    return None if state is None else state.checkpointing


def is_checkpointing_active(model) -> bool:
    """Whether any layer currently checkpoints (without transformers' deprecation warning)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in base_transformers_model(model).modules())


def set_checkpointing_active(model, active: bool) -> None:
    """Switch checkpointing on (in the configured mode) or off without changing the configured mode."""
    base = base_transformers_model(model)
    state = model_state(base, create=False)
    mode = None if state is None else state.checkpointing
    if active and mode:
        checkpoint_kwargs, every_n_layers = state.checkpoint_args
        _enable(base, mode, checkpoint_kwargs, every_n_layers)
    elif not active:
        _disable(base)
