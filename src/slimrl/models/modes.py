"""Switching a model between generation and training: FastLanguageModel.for_inference / for_training.

  for_inference: eval(), config.use_cache=True, checkpointing off, attached tokenizer padding_side="left".
  for_training:  train(), config.use_cache=False, checkpointing on in the configured mode (only if one was
                 configured and is not False), attached tokenizer padding_side="right".

Choices:
- The patched trainers call these around every rollout, so they are cheap (a walk over modules, no reallocation)
  and idempotent, and for_training after for_inference gives back exactly the training state.
- The configured checkpointing mode (ModelState.checkpointing) is never changed here, only switched on and off;
  with no configured mode the model's current checkpointing flags are left as they are.
- The tokenizer is the one from_pretrained attached (ModelState.tokenizer); none attached: nothing to do.
- `generating()`: a run-time flag (not a mode of the model) for the duration of one generation, so that a forward can
  tell generation from training and scoring: slimrl's long-context levers are for those, never for generation. The
  padding-free forward and the row groups are installed only around TRL's log-prob method and compute_loss
  (patches/scoring/row_groups.py), so generation never meets them; the tiled MLP stays on the model and reads this flag.
"""

from __future__ import annotations

import contextlib

from ..state import model_state
from ..swaps import RunValue
from . import checkpointing

GENERATING = RunValue("generating", False, "inside a rollout or model.generate: the long-context swaps pass through")


def generating():
    """The block generates (prefill and decoding): slimrl's long-context swaps pass through (tiled_mlp.py). Bound by
    the patched trainers' rollouts (patches/trainers/online.py) and slimrl's `model.generate` (cached_generate.py)."""
    return GENERATING.bound(True)


def is_generating() -> bool:
    return GENERATING.get()


def _configs(model):
    base = checkpointing.base_transformers_model(model)
    seen = []
    for module in base.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "use_cache") and all(config is not c for c in seen):
            seen.append(config)
    return seen


def attached_tokenizer(model):
    """The tokenizer from_pretrained returned (an image-text model's: its processor's tokenizer), or None."""
    state = model_state(model, create=False)
    tokenizer = None if state is None else state.tokenizer
    return getattr(tokenizer, "tokenizer", tokenizer)


def _switch(model, training: bool):
    model.train(training)
    for config in _configs(model):
        config.use_cache = not training
    if checkpointing.checkpointing_mode(model) is not None:
        checkpointing.set_checkpointing_active(model, training)
    tokenizer = attached_tokenizer(model)
    if tokenizer is not None:
        tokenizer.padding_side = "right" if training else "left"
    return model


@contextlib.contextmanager
def cache_on_checkpointing_off(model):
    """The KV cache on and checkpointing off inside the block, then exactly the settings before; train/eval and the
    tokenizer untouched (neither changes a number: TRL's sampling in train mode keeps its dropout)."""
    configs = _configs(model)
    caches = [config.use_cache for config in configs]
    switch = checkpointing.checkpointing_mode(model) and checkpointing.is_checkpointing_active(model)
    for config in configs:
        config.use_cache = True
    if switch:
        checkpointing.set_checkpointing_active(model, False)
    try:
        yield model
    finally:
        for config, cache in zip(configs, caches):
            config.use_cache = cache
        if switch:
            checkpointing.set_checkpointing_active(model, True)


def for_inference(model):
    """Put `model` in generation mode; returns it."""
    return _switch(model, training=False)


def for_training(model):
    """Put `model` back in training mode; returns it."""
    return _switch(model, training=True)


def mode_state(model) -> dict:
    """Everything for_inference/for_training touch, for comparisons in tests and debugging."""
    base = checkpointing.base_transformers_model(model)
    layers = []
    for name, module in base.named_modules():
        if hasattr(module, "gradient_checkpointing"):
            func = getattr(module, "_gradient_checkpointing_func", None)
            func_id = (getattr(func, "func", func), getattr(func, "args", ())[1:], getattr(func, "keywords", None))
            layers.append((name, module.gradient_checkpointing, func_id if module.gradient_checkpointing else None))
    tokenizer = attached_tokenizer(model)
    return {
        "training": [(name, m.training) for name, m in model.named_modules()],
        "use_cache": [c.use_cache for c in _configs(model)],
        "checkpointing_mode": checkpointing.checkpointing_mode(model),
        "checkpointing_layers": layers,
        "input_grad_hooks": len(getattr(base, "_require_grads_hooks", None) or []),
        "requires_grad": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "padding_side": getattr(tokenizer, "padding_side", None),
    }
