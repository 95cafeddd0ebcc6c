"""`model.fast_generate`: vLLM generation on the model's engine, with Unsloth's meaning of `lora_request`.

In Unsloth, `model.fast_generate` is the engine's own `LLM.generate` on weights shared with the training model, and
the LoRA adapter lives apart from them: without a `lora_request` it generates with the base model, with
`model.load_lora(folder)`'s request with the adapter saved there. Its notebooks rely on that: the cell before
training (and the comparison after it) passes `lora_request=None` to show the base model, the cell after
`model.save_lora(folder)` passes `model.load_lora(folder)` to show the trained one. slimrl follows it:

- no `lora_request` → the base model (a model without LoRA, e.g. full fine-tuning: its weights as they are now,
  which is what Unsloth's shared weights give);
- `lora_request=model.load_lora(folder)` → the adapter saved in `folder`, on either weight hand-over;
- `use_adapter=True` (slimrl's keyword) → the adapter as it is now, without saving it; `use_adapter=False` → base.

Where Unsloth is silent, slimrl chooses: `lora_request` and `use_adapter` together raise (two answers to one
question), and other keywords go to vLLM's `LLM.generate` unchanged (as they do in Unsloth). slimrl before this
version generated with the live adapter when no `lora_request` was given; a model with a LoRA adapter that takes
the base-model path says so once (notices.py), naming both ways of getting the adapter.
"""

from __future__ import annotations

from ..notices import notice
from ..swaps import swap
from . import weights

BASE_MODEL_NOTICE = (
    "model.fast_generate without lora_request generates with the base model, as in Unsloth (slimrl 0.1 used the "
    "current adapter): pass lora_request=model.load_lora(folder) for a saved adapter, or use_adapter=True for the "
    "adapter as it is now."
)


def adapter_choice(model, use_adapter: bool | None, lora_request) -> bool | None:
    """The `use_adapter` the engine gets for a `fast_generate` call (module docstring); None with a request."""
    if lora_request is not None:
        if use_adapter is not None:
            raise ValueError(
                "fast_generate got both lora_request and use_adapter: pass lora_request for a saved adapter, "
                "use_adapter=True for the adapter as it is now, or neither for the base model."
            )
        return None
    if use_adapter is None:
        if weights.has_lora(model) and not weights.adapters_disabled(model):
            notice(BASE_MODEL_NOTICE)
        return False
    return bool(use_adapter)


def attach_engine(model, engine) -> None:
    """`model.vllm_engine` and `model.fast_generate` (also reachable through a PeftModel made later)."""
    swap(model, "vllm_engine", engine, "fast_inference=True: the vLLM engine")

    def fast_generate(
        prompts,
        sampling_params=None,
        *,
        lora_request=None,
        use_adapter: bool | None = None,
        use_tqdm: bool = False,
        **generate_kwargs,
    ):
        """Generate with vLLM (`LLM.generate`'s arguments) on this model's engine.

        prompts: a string, a list of strings, or vLLM prompt dicts ({"prompt_token_ids": [...]}).
        sampling_params: a vllm.SamplingParams (vLLM's defaults otherwise).
        lora_request: `model.load_lora(folder)` = the adapter saved there; None = the base model (as in Unsloth).
        use_adapter: slimrl's: True = the adapter as it is now (no save needed); False = the base model.
        """
        return engine.generate(
            prompts,
            sampling_params,
            model=model,
            use_adapter=adapter_choice(model, use_adapter, lora_request),
            lora_request=lora_request,
            use_tqdm=use_tqdm,
            **generate_kwargs,
        )

    swap(model, "fast_generate", fast_generate, "fast_inference=True: generation on the vLLM engine")
