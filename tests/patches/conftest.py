"""Fixtures shared by the parity and equivalence tests."""

import pytest

from slimrl.patches import registry

import _tiny as T


@pytest.fixture
def unpatched():
    """Every test starts and ends with stock TRL, even when it fails half-way."""
    registry.unpatch()
    yield
    registry.unpatch()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, request):
    """A tiny model saved to a folder (TRL reloads a full-fine-tuning reference from its path), one per module."""
    return T.save_tiny(str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])))
