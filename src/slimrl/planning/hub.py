"""A Hub id's config for the planner: the planner reads only the model's config.json, so a Hub that cannot be reached
fails in about a second with what works instead, not after half a minute of retries.

Choices:
- Unless offline mode is on (HF_HUB_OFFLINE), a connection to the Hub's host (HF_ENDPOINT, or the HTTPS proxy when
  one is set) is tried first, for at most PROBE_TIMEOUT_S. Unreachable: the config is read from the local
  Hugging Face cache only (offline for this one read, said in a notice); not cached: ModelSourceError.
- Every failure says the three ways out: a local folder holding config.json, the right Hub id, or HF_HUB_OFFLINE=1
  with the model in the local cache.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from ..models.sources import ModelSourceError

PROBE_TIMEOUT_S = 2.0
_TRUE = ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def unreachable_reason(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the Hub at `endpoint` cannot be reached (None when a connection opens within `timeout` seconds)."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("ALL_PROXY")
    url = urlparse(proxy or endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return None  # nothing to check: let the library try
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port}{' (the HTTPS proxy)' if proxy else ''}: {exc}"


def fix_message(name: str, reason: str, offline: bool) -> str:
    last = "unset HF_HUB_OFFLINE to download it"
    if not offline:
        last = "with the model in the local cache, set HF_HUB_OFFLINE=1"
    return (
        f"{name!r}: the memory plan reads only the model's config.json, and {reason}. Pass a local folder that holds "
        f"config.json (--model_name_or_path path/to/model), check the Hub id, or {last}."
    )


def hub_config(name: str):
    """`name`'s transformers config from the Hub (or, offline or unreachable, the local cache); ModelSourceError
    naming the fix when it cannot be read."""
    from transformers import AutoConfig

    offline = hub_offline()
    reason = None if offline else unreachable_reason(hub_endpoint())
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=offline or reason is not None)
    except OSError as exc:
        if offline:
            why = "HF_HUB_OFFLINE is set and the local cache holds no copy"
        elif reason:
            why = f"the Hugging Face Hub cannot be reached ({reason}) and the local cache holds no copy"
        else:
            why = f"it could not be read from the Hugging Face Hub: {str(exc).strip().splitlines()[0]}"
        raise ModelSourceError(fix_message(name, why, offline)) from exc
    if reason is not None:
        from ..notices import notice

        notice(f"the Hugging Face Hub cannot be reached ({reason}): {name}'s config.json read from the local cache")
    return config
