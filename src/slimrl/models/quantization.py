"""bitsandbytes NF4 (QLoRA) loading support, including on CPU.

Choices:
- `load_in_4bit=True` means NF4 with double quantization off and the compute dtype equal to the model dtype
  slimrl picked (bf16 where the device computes it fast), as QLoRA does.
- bitsandbytes 0.50 `Linear4bit.forward`, on a CPU with AVX512-BF16, repacks the weight in place the first time
  it runs in eval mode on an input without grad (what `generate` does) into a layout for a gemv kernel that has no
  autograd; every later backward through that layer silently drops the gradient. GRPO alternates generation and
  training, so we switch that path off (`support_avx512bf16_for_cpu = False`) on every `Linear4bit` right after
  loading, before any forward. Gradients stay right; generation then dequantizes each weight per forward, which
  slimrl's `model.generate` turns into once per call (dequantized_generate.py).
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from ..swaps import swap
from ..versions import EXTRAS_SUPPORTED

logger = logging.getLogger("slimrl")

_INSTALL = (
    f"`pip install 'bitsandbytes{EXTRAS_SUPPORTED['bitsandbytes']}'` (the version slimrl's CPU guard is built on)"
)
CPU_REPACK_FLAG = "support_avx512bf16_for_cpu"


def bnb_4bit_config(compute_dtype: torch.dtype):
    """The `BitsAndBytesConfig` for NF4 loading, or an ImportError saying how to install bitsandbytes."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(
            f"load_in_4bit=True needs bitsandbytes, which is not installed: {_INSTALL}, "
            "or load with load_in_4bit=False."
        )
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=False,
    )


def disable_cpu_repacking(model) -> int:
    """Turn off bitsandbytes' grad-dropping CPU repack on every `Linear4bit`; returns how many layers were set."""
    import bitsandbytes as bnb

    count = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            if not hasattr(module, CPU_REPACK_FLAG):
                # The attribute moved: the trap may be back under another name, so refuse rather than train wrong
                raise RuntimeError(
                    f"bitsandbytes {getattr(bnb, '__version__', '?')}: Linear4bit has no `{CPU_REPACK_FLAG}`; slimrl "
                    "cannot guard against its CPU weight repacking (which drops gradients). Use bitsandbytes 0.50.x "
                    "or load_in_4bit=False."
                )
            swap(module, CPU_REPACK_FLAG, False, "no CPU weight repacking (it drops gradients)")
            count += 1
    return count


def quantization_error(exc: Exception, device: str) -> RuntimeError:
    """Explain a bitsandbytes failure at load time."""
    return RuntimeError(
        f"Loading in 4-bit (bitsandbytes NF4) failed on device {device!r}: {exc}. bitsandbytes runs on CUDA, "
        f"and on CPU from version 0.48; install a supported one with {_INSTALL}, or load with load_in_4bit=False."
    )
