"""`model.generate` on the model FastLanguageModel.from_pretrained returns: the KV cache on and gradient checkpointing
off for the call, then exactly the settings before, as Unsloth's own `generate` does.

After `trainer.train()` the model is left as training wants it: `config.use_cache=False` and checkpointing on. A plain
`model.generate(...)` then generates without a KV cache (transformers' rule under checkpointing), recomputing the
whole sequence for every new token and saying so twice. Unsloth's notebooks call `model.generate` right after
training. On slimrl's model (an instance-level swap: no other model, and not the class, changes; a PeftModel made
later reaches it through its base) each call runs inside `modes.cache_on_checkpointing_off`. Choices:
1. train/eval is left as it is (Unsloth's `generate` also switches to eval): inside a trainer TRL samples in train
   mode and slimrl keeps its numbers; for eval-mode generation call `FastLanguageModel.for_inference(model)` first.
2. `generate(input_ids=tokenizer(...))` (a BatchEncoding, as older notebooks pass it) gets the encoding's fields as
   keywords, as transformers 4.x took it, with one notice; transformers 5 fails on it.
3. Without `fast_inference=True`, `model.fast_generate` is this same `generate`, as in Unsloth (with it, the vLLM
   engine's, generation/fast_generate.py, replaces it).
4. A 4-bit model on CPU: its weights are dequantized once per call, not once per token (dequantized_generate.py).
"""

from __future__ import annotations

from .. import swaps
from ..notices import notice
from . import modes
from .dequantized_generate import dequantized_once

NAME = "generate"
ENCODING_NOTICE = (
    "model.generate(input_ids=tokenizer(...)): the encoding's fields are passed as keywords (input_ids, "
    "attention_mask), as transformers 4.x took it; transformers 5 needs generate(**tokenizer(...))."
)


class CachedGenerate:
    """`generate` of one model with the KV cache on and checkpointing off for the call."""

    def __init__(self, model):
        self.model = model

    def __reduce__(self):  # copies of the model get their own, bound to the copy
        return type(self), (self.model,)

    def __call__(self, *args, **kwargs):
        encoding = kwargs.get("input_ids")
        if encoding is not None and not hasattr(encoding, "shape") and hasattr(encoding, "items"):
            notice(ENCODING_NOTICE)
            for key, value in kwargs.pop("input_ids").items():
                kwargs.setdefault(key, value)
        with modes.cache_on_checkpointing_off(self.model), modes.generating(), dequantized_once(self.model):
            return getattr(type(self.model), NAME)(self.model, *args, **kwargs)


def swap_in(model) -> None:
    """Give `model` (a transformers model with `generate`) the cached generate; once."""
    if NAME in vars(model) or not callable(getattr(type(model), NAME, None)):
        return
    cached = CachedGenerate(model)
    swaps.swap(model, NAME, cached, "model.generate: KV cache on, checkpointing off for the call")
    swaps.swap(model, "fast_generate", cached, "without fast_inference: fast_generate is generate, as in Unsloth")


def is_swapped(model) -> bool:
    return isinstance(vars(model).get(NAME), CachedGenerate)
