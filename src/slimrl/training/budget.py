"""The memory budget a training enforces: the config field `slimrl_max_memory_gb` (CLI: `--max_memory_gb`), its
validator and its reading. Its own module so that both the out-of-memory stop (oom.py) and its message
(oom_message.py) read it without importing each other."""

from __future__ import annotations

from .. import fields

BUDGET_FIELD = fields.MAX_MEMORY_GB


def validate_memory_budget(value, name: str = BUDGET_FIELD):
    """None, or a positive number of GiB."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of GiB (or None for no budget), got {value!r}.")
    return float(value)


def budget_gb(args) -> float | None:
    """The budget set on a TRL config (None: no budget)."""
    value = getattr(args, BUDGET_FIELD, None)
    return float(value) if value is not None else None
