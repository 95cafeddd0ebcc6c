"""`save_pretrained_merged`: the LoRA merged into the base, saved as a plain transformers folder (vLLM, TGI, HF).

Choices:
- Never merged in place: `slimrl.generation.weights.engine_weights` computes W + ΔW into new tensors (a 4-bit base
  dequantized first), so the training model keeps its adapter and its exact base weights and can keep training.
  peft's merge_and_unload / merge_adapter would round the base weights on the way back.
- Safetensors through `huggingface_hub.save_torch_state_dict` (shards above `max_shard_size`, default "5GB" as in
  Unsloth and transformers, plus the index transformers reads); config.json without any quantization_config
  (GGUF or bitsandbytes bookkeeping of the source) and with the saved dtype; generation_config.json; the tokenizer
  with its chat template.
- merged_16bit dtype: float16 (Unsloth documents merged_16bit as "float16 weights"), whatever the model computes
  in, with a one-line notice when that differs; `dtype=` chooses. Why not bfloat16 for a bfloat16 model: W + ΔW is
  rounded to 16 bits, and a short run's ΔW sits below bfloat16's 8-bit mantissa. Measured on a 2-step GRPO adapter
  of SmolLM2-135M (32 held-out prompts, greedy): the float16 folder answered as the adapter on 32/32, the bfloat16
  one on 24/32 (the base model alone: 22/32). A value beyond float16's range raises, naming dtype=torch.bfloat16.
- merged_4bit (Unsloth also accepts "merged_4bit_forced"): the merged 16-bit folder is written to a temporary
  folder and reloaded by transformers with bitsandbytes NF4 (slimrl's own 4-bit settings), then saved: transformers
  and bitsandbytes write the 4-bit format, not slimrl. Lossy: keep a 16-bit copy if you will convert again.
- "lora" saves the adapter alone (PEFT format, `save_lora`).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
import warnings

import torch

from ..generation.weights import checkpoint_name, engine_weights
from ..state import model_state

logger = logging.getLogger("slimrl")

SAVE_METHODS = ("merged_16bit", "merged_4bit", "lora")
MAX_SHARD_SIZE = "5GB"  # Unsloth's and transformers' default
_ALIASES = {"merged_4bit_forced": "merged_4bit", "16bit": "merged_16bit", "4bit": "merged_4bit"}
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def resolve_save_method(save_method: str) -> str:
    method = _ALIASES.get(save_method, save_method)
    if method not in SAVE_METHODS:
        raise ValueError(
            f"save_method must be one of {list(SAVE_METHODS)} (or 'merged_4bit_forced'); got {save_method!r}"
        )
    return method


def model_dtype(model) -> torch.dtype:
    """The dtype the model computes in: slimrl's recorded choice, else its first floating-point parameter's."""
    state = model_state(model, create=False)
    dtype = None if state is None else state.dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def merged_16bit_dtype(model, dtype=None) -> torch.dtype:
    """The dtype merged_16bit writes (see the module docstring); announces a change from the model's own."""
    if dtype is not None:
        from ..models.dtypes import parse_dtype

        return parse_dtype(dtype)
    own = model_dtype(model)
    if own != torch.float16:
        warnings.warn(
            f"save_method='merged_16bit': the model computes in {str(own).removeprefix('torch.')}; saving "
            "float16, whose 3 more mantissa bits keep small LoRA updates that bfloat16 rounds away (pass "
            "dtype=torch.bfloat16 or torch.float32 to choose).",
            UserWarning,
            stacklevel=4,
        )
    return torch.float16


def _persistent_buffers(model):
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                yield checkpoint_name(f"{module_name}.{name}" if module_name else name), buffer


def merged_state_dict(model, dtype: torch.dtype, use_adapter: bool = True) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors of the merged model in `dtype` (new tensors wherever the LoRA changes a weight)."""
    state = dict(engine_weights(model, dtype, use_adapter=use_adapter))
    for name, buffer in _persistent_buffers(model):
        state.setdefault(name, buffer.detach())
    if dtype == torch.float16:
        overflowing = [name for name, tensor in state.items() if tensor.is_floating_point() and tensor.isinf().any()]
        if overflowing:
            raise ValueError(
                f"Merged weights exceed float16's range in {overflowing[:3]}; save with "
                "dtype=torch.bfloat16 (or torch.float32)."
            )
    return state


def export_config(model, dtype: torch.dtype):
    """A copy of the model's config for a plain checkpoint in `dtype` (no quantization bookkeeping)."""
    config = copy.deepcopy(model.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    if not getattr(config, "architectures", None):
        config.architectures = [type(_transformers_model(model)).__name__]
    return config


def _transformers_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def save_tokenizer(tokenizer, save_directory: str) -> None:
    if tokenizer is None:
        warnings.warn(
            "No tokenizer given (and none recorded by FastLanguageModel.from_pretrained): the folder has "
            "no tokenizer; save it with tokenizer.save_pretrained(...).",
            UserWarning,
            stacklevel=4,
        )
        return
    tokenizer.save_pretrained(save_directory)


def write_checkpoint(
    model, folder: str, dtype: torch.dtype, max_shard_size=MAX_SHARD_SIZE, use_adapter: bool = True
) -> int:
    """The merged weights (safetensors, sharded above `max_shard_size`), config and generation config; returns the
    number of tensors written."""
    from huggingface_hub import save_torch_state_dict

    state = merged_state_dict(model, dtype, use_adapter=use_adapter)
    os.makedirs(folder, exist_ok=True)
    save_torch_state_dict(state, folder, max_shard_size=max_shard_size, metadata={"format": "pt"})
    export_config(model, dtype).save_pretrained(folder)
    generation_config = getattr(_transformers_model(model), "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    return len(state)


def save_merged_16bit(
    model, save_directory: str, tokenizer, dtype: torch.dtype, max_shard_size=MAX_SHARD_SIZE, use_adapter: bool = True
) -> str:
    """The merged checkpoint in `dtype` plus the tokenizer; returns the folder."""
    count = write_checkpoint(model, save_directory, dtype, max_shard_size, use_adapter)
    save_tokenizer(tokenizer, save_directory)
    logger.info(
        "slimrl: merged model (%s, %d tensors) saved to %s", str(dtype).removeprefix("torch."), count, save_directory
    )
    return save_directory


def save_merged_4bit(model, save_directory: str, tokenizer, max_shard_size=MAX_SHARD_SIZE) -> str:
    """Merge to a temporary 16-bit folder, reload it as NF4 with transformers + bitsandbytes, save that."""
    from transformers import AutoModelForCausalLM

    from ..models.quantization import bnb_4bit_config

    compute = model_dtype(model)
    compute = compute if compute in _SIXTEEN_BIT + (torch.float32,) else torch.bfloat16
    temp = tempfile.mkdtemp(prefix="slimrl-merge4-")
    try:
        write_checkpoint(model, temp, compute)
        device_map = {"": 0} if torch.cuda.is_available() else "cpu"
        quantized = AutoModelForCausalLM.from_pretrained(
            temp, dtype=compute, device_map=device_map, quantization_config=bnb_4bit_config(compute)
        )
        quantized.save_pretrained(save_directory, max_shard_size=max_shard_size)
        save_tokenizer(tokenizer, save_directory)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return save_directory
