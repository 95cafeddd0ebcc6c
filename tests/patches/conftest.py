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


@pytest.fixture
def leaky_sharing(monkeypatch):
    """Negative control of the shared-prefix suites: packed completions also see their siblings."""
    from slimrl.ops import shared_prefix as op

    real = op.attention_mask_4d

    def leaky(packed, attn_implementation, dtype):
        segment = packed.segment
        siblings = (segment[:, None, :] > 0) & (segment[:, :, None] > 0)
        return real(packed, attn_implementation, dtype) | siblings[:, None]

    monkeypatch.setattr(op, "attention_mask_4d", leaky)
