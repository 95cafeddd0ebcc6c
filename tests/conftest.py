"""Test-wide settings: offline hub, no telemetry, and a guarantee that no test leaks a TRL patch into the next."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The in-process suite patches explicitly (stock and patched sides in one process): no patching on import here.
# tests/patches/test_auto_patch.py runs fresh interpreters without this variable.
os.environ.setdefault("SLIMRL_NO_AUTO_PATCH", "1")
# torch's threads are the suite's (one, below), never the busy-machine policy's: it would change them between a
# stock run and a patched one as the machine's load changes. The policy's own tests unset this variable.
os.environ.setdefault("SLIMRL_THREADS", "keep")

import pytest  # noqa: E402
import torch  # noqa: E402

# One thread for the whole suite, whichever subset runs: the tiny models run fastest on one, and every comparison
# runs the same kernels whether a file runs alone or with the rest. Tests that train the embedded model for minutes
# take every core with the `all_cores` fixture.
torch.set_num_threads(1)

# SLIMRL_CI=1 (scripts/test.sh, CI): a skip for a missing install fails (tests/_ci_mode.py); tests moved from the
# default tier to the slow one for time, with their reasons (tests/_tier_budget.py)
pytest_plugins = ["_ci_mode", "_tier_budget"]


@pytest.fixture
def all_cores():
    """torch on every core for this test, then the suite's one thread again."""
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _no_leaked_patches():
    yield
    from slimrl.patches import registry

    if registry.is_patched():
        registry.unpatch()
