"""Activation (gradient) checkpointing modes for slimrl models, pinned so TRL and transformers cannot change them.

Modes, recorded on the transformers model (slimrl.state.ModelState.checkpointing; reached through a PeftModel too):
  False      no checkpointing.
  True       non-reentrant `torch.utils.checkpoint` around every decoder layer (transformers' own mechanism).
  "offload"  the same, and the layer inputs that checkpointing keeps for the recompute wait in host memory
             (slimrl.models.offload: side copy stream, pinned buffer pool, prefetch, newest input kept on the
             device). "unsloth" is an alias.

Choices:
1. Which mode a run gets is decided in one place, `resolve_checkpointing`, from every input that bears on it: the
   mode asked for (get_peft_model's `use_gradient_checkpointing`, the CLI's), the model's mark (the mode slimrl
   recorded on it), the TRL config's `gradient_checkpointing` flag and its keywords' `offload` (`config_inputs`),
   TRL's `activation_offloading`, and the device. The planner gives it what the trainer will see: the plan's
   `use_gradient_checkpointing` as the model's mark (get_peft_model records it), so rows 2 and 4 apply to a plan as
   to a run. Its precedence is the table `ROWS`, first matching row wins:
   1. a mode asked for: that mode;
   2. the model marked "offload" and TRL's `activation_offloading=True`: True (TRL's hook, the outer one, already
      moves the checkpointed layer inputs; two offloads would fight over them);
   3. the model marked: its mark (the more specific choice; the config's flag is aligned to it);
   4. the config's flag on with `offload: True` among its keywords (transformers' own offload): "offload";
   5. otherwise the config's flag: True or False.
   The device decides only whether "offload" moves anything (`Checkpointing.moves`): on a CUDA device, or with an
   offloader set to move host tensors; a CPU run's "offload" keeps host tensors where they are.
2. Offloading uses our own checkpoint function instead of transformers'
   `activation_checkpointing_enable(offload=True)`. Both rely on the same fact: non-reentrant checkpointing saves the
   layer inputs through autograd's saved-tensor hooks (`_NoopSaveInputs.save_for_backward`), so an outer hook sees
   them and can move them. But transformers wraps the call in `save_on_cpu(pin_memory=True)`, which copies on the
   compute stream (the step waits for every copy), allocates host memory every step, moves the last layer's input
   out and straight back, and raises on a CPU-only torch build. Ours (slimrl.models.offload) copies beside the
   compute and leaves host tensors where they are, so on a CPU-only machine "offload" costs what True costs and
   gives the same numbers.
3. One ActivationOffloader per model (ModelState.offloader), made when "offload" is first enabled and kept through
   every later enable, so its host buffers are reused from step to step; `configure_offload` changes its settings.
4. The mode must survive the places that re-enable checkpointing themselves: `Trainer.train` when the config's flag
   is on (`gradient_checkpointing_enable(...)` before transformers 5.23, `activation_checkpointing_enable(...)` from
   5.23), TRL's `unwrap_model_for_generation` and `disable_gradient_checkpointing` and peft (disable, then
   `gradient_checkpointing_enable(kwargs)`, on every release). We set an instance-level `gradient_checkpointing_enable`
   on the transformers model (as TRL's selective checkpointing does): before 5.23 it is the one name every caller
   uses; from 5.23 transformers' `_is_overridden` routes `activation_checkpointing_enable` through it; PeftModel
   forwards both names to the base model. The wrapper enables the model's own mode whatever the caller asked; mode
   False turns enables into no-ops (warned once). It is a bound method (`types.MethodType`) so `copy.deepcopy` rebinds
   it to the copy.
5. The input-embedding `requires_grad` hook (without it LoRA in layer 0 gets no gradient under checkpointing) is
   registered once; transformers' enable registers another one on every call.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ..state import model_state, transformers_model
from ..swaps import swap
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


@dataclass(frozen=True)
class CheckpointingInputs:
    """Everything that bears on the mode (Choices 1); a field left at its default was not given."""

    asked: bool | str | None = None  # use_gradient_checkpointing of get_peft_model, the CLI or slimrl.plan
    mark: bool | str | None = None  # the mode recorded on the model (checkpointing_mode); None: never configured
    flag: bool | str | None = False  # the TRL config's gradient_checkpointing (a plan's dict may give text)
    kwargs_offload: bool = False  # `offload: True` among the config's checkpointing keywords
    trl_offloading: bool = False  # TRL's activation_offloading
    device: str | None = None  # "cuda" | "cpu": only whether "offload" moves anything
    host_tensors: bool = False  # the offloader moves host tensors too (configure_offload(host_tensors=True))


@dataclass(frozen=True)
class Row:
    """One precedence rule: when `test` holds (and no earlier row did), the mode is `mode`."""

    number: int
    when: str
    test: Callable[[CheckpointingInputs], bool]
    mode: Callable[[CheckpointingInputs], bool | str]


def _flag_mode(flag) -> bool | str:
    """The config's flag as a mode: text read as use_gradient_checkpointing is (a dict may say "offload"), else its
    truth."""
    return normalize_mode(flag) if isinstance(flag, str) else bool(flag)


ASKED, TRL_OFFLOADS, MARKED, CONFIG_OFFLOAD, CONFIG_FLAG = 1, 2, 3, 4, 5
ROWS = (
    Row(ASKED, "a mode asked for", lambda i: i.asked is not None, lambda i: normalize_mode(i.asked)),
    Row(
        TRL_OFFLOADS,
        "the model marked 'offload' and TRL's activation_offloading",
        lambda i: i.mark == "offload" and bool(i.trl_offloading),
        lambda i: True,
    ),
    Row(MARKED, "the model's mark", lambda i: i.mark is not None, lambda i: i.mark),
    Row(
        CONFIG_OFFLOAD,
        "the config's flag on, its keywords asking offload",
        lambda i: _flag_mode(i.flag) is not False and bool(i.kwargs_offload),
        lambda i: "offload",
    ),
    Row(CONFIG_FLAG, "the config's flag", lambda i: True, lambda i: _flag_mode(i.flag)),
)


@dataclass(frozen=True)
class Checkpointing:
    """A resolved mode, the row of ROWS that decided it, and whether its offload moves layer inputs to the host."""

    mode: bool | str
    row: int
    moves: bool


CHECKPOINT_KWARGS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")  # transformers 5, TRL 1.16


def checkpoint_kwargs_of(values: dict) -> dict:
    """A config's checkpointing keywords (its fields as a dict: `vars(args)` or a plan's), under transformers' new
    name or TRL 1.16's, the first one given."""
    for name in CHECKPOINT_KWARGS:
        kwargs = values.get(name)
        if kwargs:
            return dict(kwargs)
    return {}


def config_inputs(values: dict) -> dict:
    """What a TRL config gives `resolve_checkpointing` at trainer set-up (its fields as a dict): the flag and its
    keywords' `offload` (TRL's activation_offloading, row 2, is the offline families' own check)."""
    return dict(
        flag=values.get("gradient_checkpointing", False),
        kwargs_offload=bool(checkpoint_kwargs_of(values).get("offload")),
    )


def resolve_checkpointing(**inputs) -> Checkpointing:
    """The checkpointing mode for `inputs` (CheckpointingInputs' fields), by the first matching row of ROWS."""
    given = CheckpointingInputs(**inputs)
    row = next(row for row in ROWS if row.test(given))
    mode = row.mode(given)
    moves = mode == "offload" and (given.device == "cuda" or bool(given.host_tensors))
    return Checkpointing(mode, row.number, moves)


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
    pinned = types.MethodType(_pinned_gradient_checkpointing_enable, base)
    swap(
        base,
        "gradient_checkpointing_enable",
        pinned,
        "the configured checkpointing mode kept (slimrl.models.checkpointing)",
    )


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
