"""What a trainer family declares (`Family`: online.py, offline.py, slimrl.ppo) and what its checks see of a
trainer's `__init__` call (`SetupCall`); the set-up that reads them is config_setup.py and trainer_setup.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


class SetupCall(NamedTuple):
    """A trainer's `__init__` call as slimrl's checks see it: the model, the config, every argument by name."""

    model: Any
    args: Any
    arguments: dict


@dataclass(frozen=True)
class Family:
    """What differs between trainer families; everything else in this module is shared."""

    config_fields: tuple[tuple[str, Any], ...] = ()  # (name, default) of the family's extra config fields
    renamed_fields: tuple[tuple[str, str], ...] = ()  # (old name, TRL 1.16's name) accepted with a notice
    removed_fields: tuple[tuple[str, str], ...] = ()  # (name TRL removed, what replaced it) -> error
    check_config: Callable[[Any], None] = lambda args: None  # config-time checks (args -> None, raise on error)
    adapters: tuple[Callable[[SetupCall], None], ...] = ()  # may change call.arguments before TRL's __init__
    checks: tuple[Callable[[SetupCall], None], ...] = ()  # trainer-time checks, before TRL's __init__
    around: Callable[[SetupCall], Any] | None = None  # a context manager around TRL's __init__ (entered first)
