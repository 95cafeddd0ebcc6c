"""The dtype a model loads in, for FastLanguageModel.from_pretrained, FastModel's image-text models, the CLI and
`slimrl doctor`.

dtype=None (or "auto") picks bfloat16 where the device computes it fast (CUDA with bf16 support; a CPU with AMX or
AVX512-BF16, read from /proc/cpuinfo), else float32; the reason is returned with the choice, to be logged. A dtype
given as a torch.dtype or a name ("bfloat16", "bf16", "float32", ...) is taken as requested; transformers 4.x's
`torch_dtype=` keyword is read as `dtype=` with a notice.
"""

from __future__ import annotations

import torch

from ..notices import notice

_DTYPE_NAMES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def cpu_bf16_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set[str]:
    """The bf16-related CPU flags (`amx_bf16`, `avx512_bf16`) present on this machine."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                if line.startswith("flags"):
                    return {"amx_bf16", "avx512_bf16"} & set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def parse_dtype(dtype) -> torch.dtype | None:
    """torch.dtype, a name ("bfloat16", "bf16", "float32", ...), or None/"auto" (= let slimrl choose)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        if dtype.lower() == "auto":
            return None
        name = dtype.lower().removeprefix("torch.")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise ValueError(f"dtype must be a torch.dtype, one of {sorted(_DTYPE_NAMES)}, 'auto' or None; got {dtype!r}")


def choose_dtype(dtype, device_type: str, cpu_flags: set[str] | None = None) -> tuple[torch.dtype, str]:
    """(dtype, reason): the user's dtype if given, else bf16 where the device computes it fast, else float32."""
    parsed = parse_dtype(dtype)
    if parsed is not None:
        return parsed, "requested"
    if device_type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "CUDA device supports bfloat16"
        return torch.float32, "CUDA device without bfloat16 support"
    flags = cpu_bf16_flags() if cpu_flags is None else cpu_flags
    if flags:
        return torch.bfloat16, f"CPU has {' and '.join(sorted(flags))}"
    return torch.float32, "CPU has no AMX/AVX512-BF16, bfloat16 would be emulated (slow)"


def take_torch_dtype(dtype, kwargs: dict):
    """transformers 4.x's `torch_dtype=` as `dtype=` (transformers 5's name), with a notice; both, different: error."""
    if "torch_dtype" not in kwargs:
        return dtype
    torch_dtype = kwargs.pop("torch_dtype")
    if dtype is not None and parse_dtype(dtype) != parse_dtype(torch_dtype):
        raise ValueError(f"from_pretrained got both dtype={dtype} and torch_dtype={torch_dtype}; pass only dtype.")
    notice(f"from_pretrained(torch_dtype=...) is transformers 5's dtype=...; using dtype={torch_dtype}.")
    return torch_dtype
