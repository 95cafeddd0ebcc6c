"""The sandbox tests: on a machine lacking a kernel layer, each accepts the weaker sandbox (_layers_here.py) unless it
clears or sets the opt-in itself."""

import pytest

from _layers_here import accept_weaker_sandbox_if_missing


@pytest.fixture(autouse=True)
def _weaker_sandbox_where_a_layer_is_missing(monkeypatch):
    accept_weaker_sandbox_if_missing(monkeypatch)
