"""`slimrl plan` with a Hub id: the planner reads only config.json, so a Hub that cannot be reached fails in about a
second with slimrl's message (a local folder, the Hub id, HF_HUB_OFFLINE), not after half a minute of retries."""

import socket
import time

import pytest

from slimrl.models.sources import ModelSourceError
from slimrl.planning import hub

MISSING_ID = "slimrl-tests/no-such-model"


@pytest.fixture
def online_but_unreachable(monkeypatch):
    """Offline mode off, the Hub endpoint a local port nothing listens on (no network is touched)."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    return port


def test_the_connection_check_tells_a_closed_port_from_a_listening_one(online_but_unreachable):
    assert "127.0.0.1" in hub.unreachable_reason(f"http://127.0.0.1:{online_but_unreachable}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert hub.unreachable_reason(f"http://127.0.0.1:{server.getsockname()[1]}") is None


def test_an_unreachable_hub_fails_fast_with_what_works(online_but_unreachable):
    t0 = time.perf_counter()
    with pytest.raises(ModelSourceError) as caught:
        hub.hub_config(MISSING_ID)
    assert time.perf_counter() - t0 < 5
    message = str(caught.value)
    assert "reads only the model's config.json" in message and "cannot be reached" in message
    assert "local folder that holds config.json" in message and "set HF_HUB_OFFLINE=1" in message


def test_plan_command_says_it_in_one_line(online_but_unreachable, capsys):
    from slimrl.cli import main

    assert main(["plan", "grpo", "--model_name_or_path", MISSING_ID, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"slimrl plan: error: {MISSING_ID!r}: the memory plan reads only") and len(err) == 2


def test_offline_mode_says_how_to_download(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE is set.*unset HF_HUB_OFFLINE to download it"):
        hub.hub_config(MISSING_ID)
