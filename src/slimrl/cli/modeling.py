"""Model loading for the CLI, through slimrl's FastLanguageModel (Unsloth-style API of `slimrl.models`).

An adapter folder written by `slimrl grpo` records its base model in `slimrl_run.json` (and PEFT's
adapter_config.json), so `slimrl generate --adapter DIR` needs no other flag.
"""

from __future__ import annotations

import json
import os

import torch

from slimrl.fast_language_model import FastLanguageModel
from slimrl.models.checkpointing import resolve_checkpointing

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_base(
    model_name_or_path: str, max_seq_length: int = 512, dtype: str | None = None, load_in_4bit=False, model_args=None
):
    """(model, tokenizer); `model_args` with fast_inference=True also builds the vLLM engine."""
    vllm = {}
    if model_args is not None and getattr(model_args, "fast_inference", False):
        vllm = dict(
            fast_inference=True,
            gpu_memory_utilization=model_args.gpu_memory_utilization,
            vllm_engine_kwargs={"enforce_eager": True} if model_args.vllm_enforce_eager else None,
        )
    return FastLanguageModel.from_pretrained(
        model_name_or_path,
        max_seq_length=max_seq_length,
        dtype=_DTYPES.get(dtype) if dtype else None,
        load_in_4bit=load_in_4bit,
        **vllm,
    )


def add_lora(model, model_args, gradient_checkpointing: bool, seed: int):
    asked = model_args.use_gradient_checkpointing
    use_gc = resolve_checkpointing(asked=asked, flag=gradient_checkpointing).mode
    return FastLanguageModel.get_peft_model(
        model,
        r=model_args.lora_r,
        target_modules=model_args.lora_target_modules,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        bias="none",
        use_gradient_checkpointing=use_gc,
        random_state=seed,
    )


def set_inference(model, inference: bool) -> None:
    (FastLanguageModel.for_inference if inference else FastLanguageModel.for_training)(model)


def load_adapter(
    adapter_dir: str, model_name_or_path: str | None = None, dtype: str | None = None, max_seq_length: int = 2048
):
    """(peft_model, tokenizer, run_info) for an adapter folder written by `slimrl grpo`."""
    from peft import PeftModel

    if not os.path.isfile(os.path.join(adapter_dir, "adapter_config.json")):
        raise FileNotFoundError(f"{adapter_dir!r} holds no PEFT adapter (adapter_config.json missing)")
    info = {}
    info_path = os.path.join(adapter_dir, "slimrl_run.json")
    if os.path.isfile(info_path):
        with open(info_path) as f:
            info = json.load(f)
    if model_name_or_path is None:
        model_name_or_path = info.get("model_name_or_path")
    if model_name_or_path is None:
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            model_name_or_path = json.load(f).get("base_model_name_or_path")
    if not model_name_or_path:
        raise ValueError("Cannot tell the adapter's base model: pass --model_name_or_path")
    model, tokenizer = load_base(model_name_or_path, max_seq_length=max_seq_length, dtype=dtype or info.get("dtype"))
    model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    return model, tokenizer, info
