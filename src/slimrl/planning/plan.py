"""`slimrl.plan(...)`: a training step's peak memory predicted from a model config and a training config, before
any weight is loaded (the model is built on the meta device), with the breakdown and whether it fits a device.
How the terms combine: slimrl.planning.breakdown; each term's formula: slimrl.planning.terms.
"""

from __future__ import annotations

import os

from ..families import PLANNED
from .breakdown import GiB, MemoryPlan, build_plan
from .run import algorithm_of, run_shape
from .shapes import model_shape


def _device_bytes(device: str, device_memory_gb: float | None) -> tuple[int, str]:
    if device_memory_gb is not None:
        return int(device_memory_gb * GiB), f"{device_memory_gb:g} GiB (given)"
    if device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        return total, f"{torch.cuda.get_device_name(0)}, {total / GiB:.1f} GiB"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, f"this machine's RAM, {total / GiB:.1f} GiB"


def plan(
    model,
    config=None,
    algorithm: str | None = None,
    *,
    prompt_length: int | None = None,
    max_seq_length: int | None = None,
    lora_r: int | None = 16,
    lora_target_modules=None,
    full_finetuning: bool = False,
    dtype=None,
    load_in_4bit: bool = False,
    use_gradient_checkpointing=None,
    fast_inference: bool = False,
    gpu_memory_utilization: float = 0.5,
    device: str | None = None,
    device_memory_gb: float | None = None,
    **config_fields,
) -> MemoryPlan:
    """Predict one training step's peak memory; nothing is loaded (the model is built on the meta device).

    model: a transformers config, a config dict, a config.json path or model folder, a `.gguf` file, the embedded
        model's name, or a Hub id. config: a TRL config (GRPOConfig, DPOConfig, ...) or a dict of its fields;
        `config_fields` override single fields (e.g. `max_completion_length=1024`). algorithm: taken from the
        config's class when not given. lora_r / lora_target_modules: the adapter (targets None: slimrl's default);
        `full_finetuning=True` trains every weight instead. device: "cpu" or "cuda" (default: CUDA when available).
        device_memory_gb: the memory to fit in (default: the GPU's, or this machine's RAM).
    """
    algorithm = (algorithm or algorithm_of(config) or "").lower()
    if algorithm not in PLANNED:
        raise ValueError(
            f"plan: algorithm must be one of grpo, rloo, dpo, kto, orpo, cpo (or given by the config's "
            f"class); got {algorithm or None!r}"
        )
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    lora = not full_finetuning and bool(lora_r)
    shape = model_shape(model, lora_rank=lora_r if lora else None, lora_targets=lora_target_modules)
    run = run_shape(
        algorithm,
        config,
        prompt_length=prompt_length,
        max_seq_length=max_seq_length,
        dtype=dtype,
        lora=lora,
        load_in_4bit=load_in_4bit,
        use_gradient_checkpointing=use_gradient_checkpointing,
        fast_inference=fast_inference,
        gpu_memory_utilization=gpu_memory_utilization,
        device=device,
        **config_fields,
    )
    result = build_plan(shape, run, *_device_bytes(device, device_memory_gb))
    result.notes.append(_liger_line(device, shape.model_type))
    return result


def _liger_line(device: str, model_type: str) -> str:
    from ..models.liger import plan_line

    return plan_line(device, model_type) + " (with liger_kernel='auto'; the plan counts the eager kernels' memory)"
