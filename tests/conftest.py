"""Test-wide settings: offline hub, no telemetry, and a guarantee that no test leaks a TRL patch into the next."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The in-process suite patches explicitly (stock and patched sides in one process): no patching on import here.
# tests/patches/test_auto_patch.py runs fresh interpreters without this variable.
os.environ.setdefault("SLIMRL_NO_AUTO_PATCH", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_patches():
    yield
    from slimrl.patches import registry

    if registry.is_patched():
        registry.unpatch()
