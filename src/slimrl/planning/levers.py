"""Row groups and the sequence-tiled MLP as the memory planner sees them: how many rows one policy forward and backward
holds (`group_rows`) and how many tokens one MLP shard holds in the recompute (`mlp_shard_tokens`, 0: untiled).

Both are resolved by the levers' own rules, never a copy of them: the config field, default, validator and grouping
of slimrl.ops.row_groups (`ROWS_FIELD`, `partition`, `AUTO_GROUP_TOKENS`) and the field, default, validator and shard
rule of slimrl.models.tiled_mlp (`TILED_MLP_FIELD`, `TiledMLPState.shard_tokens`). A slimrl without those modules
scores a step's rows in TRL's one forward with the untiled MLP, and so does the plan; so do algorithms other than
GRPO/RLOO.

Worst case, as everywhere in the plan: every row is prompt + completion tokens long. "auto" groups are then sized by
the token budget alone; the cap "auto" also takes from free memory at run time only lowers them where memory is
short, which a plan that fits does not model.
"""

from __future__ import annotations

import importlib.util

GROUPED = ("grpo", "rloo")


def available() -> bool:
    return all(
        importlib.util.find_spec(f"slimrl.{name}") is not None for name in ("ops.row_groups", "models.tiled_mlp")
    )


def settings(algorithm: str, fields: dict) -> tuple:
    """(rows-per-group setting, tiled-MLP setting) from the config fields; False, False where the levers don't apply."""
    if algorithm not in GROUPED or not available():
        return False, False
    from ..models.tiled_mlp import TILED_MLP_DEFAULT, TILED_MLP_FIELD, validate_tiled_mlp
    from ..ops.row_groups import ROWS_DEFAULT, ROWS_FIELD, validate_rows_per_group

    rows = fields.get(ROWS_FIELD, ROWS_DEFAULT)
    return validate_rows_per_group(rows), validate_tiled_mlp(fields.get(TILED_MLP_FIELD, TILED_MLP_DEFAULT))


def group_rows(setting, rows: int, row_tokens: int) -> int:
    """Rows of the largest group a micro-batch of `rows` rows of `row_tokens` tokens is scored in."""
    if setting is False or rows <= 1:
        return rows
    from ..ops.row_groups import AUTO_GROUP_TOKENS, partition

    auto = setting == "auto"
    groups = partition(
        list(range(rows)),
        [row_tokens] * rows,
        rows=None if auto else setting,
        tokens=AUTO_GROUP_TOKENS if auto else None,
    )
    return max(len(group) for group in groups)


def mlp_shard_tokens(setting, hidden: int, intermediate: int, call_tokens: int, activation_bytes: int) -> int:
    """Tokens of one MLP shard for a forward of `call_tokens` tokens (0: the MLP runs untiled)."""
    if setting is False:
        return 0
    from ..models.tiled_mlp import TiledMLPState

    return TiledMLPState(setting, hidden, intermediate).shard_tokens(call_tokens, activation_bytes) or 0
