"""Fixtures of the distributed tier."""

import pytest

from slimrl.patches import registry


@pytest.fixture
def unpatched():
    """Every test starts and ends with stock TRL (the 1-process runs switch states per side)."""
    registry.unpatch()
    yield
    registry.unpatch()
