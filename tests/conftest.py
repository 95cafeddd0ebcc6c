"""Test-wide settings: offline hub, no telemetry, and a guarantee that no test leaks a TRL patch into the next."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_patches():
    yield
    from slimrl.patches import registry

    if registry.is_patched():
        registry.unpatch()
