"""Row groups and the sequence-tiled MLP as the memory planner sees them: how many rows one policy forward and backward
holds (`group_rows`) and how many tokens one MLP shard holds in the recompute (`mlp_shard_tokens`, 0: untiled).

Both are resolved by the levers' own rules, never a copy of them: the config fields' names and defaults of
slimrl.fields, the validator and grouping of slimrl.ops.row_groups (`partition`, `AUTO_GROUP_TOKENS`), the validator
and shard rule of slimrl.models.tiled_mlp (`TiledMLPState.shard_tokens`), and whether "auto" turns a lever
on for the plan's device and sizes: slimrl.models.long_context, the decision a patched trainer takes at run time.
A slimrl without those modules scores a step's rows in TRL's one forward with the untiled MLP, and so does the plan;
so do algorithms other than GRPO/RLOO.

Worst case, as everywhere in the plan: every row is prompt + completion tokens long. "auto" groups are then sized by
the token budget alone; the cap "auto" also takes from free memory at run time only lowers them where memory is
short, which a plan that fits does not model.

`describe(plan)`: the "long-context levers" block `slimrl plan` prints: row groups, tiled MLP, offload and
padding-free, each on or off for this plan and why: the reasons slimrl.models.long_context gives (offload stays
opt-in: the plan names it among the settings that fit when it is one).
"""

from __future__ import annotations

import importlib.util

from .. import fields
from ..families import ONLINE


def available() -> bool:
    return all(
        importlib.util.find_spec(f"slimrl.{name}") is not None for name in ("ops.row_groups", "models.tiled_mlp")
    )


def settings(algorithm: str, values: dict) -> tuple:
    """(rows-per-group setting, tiled-MLP setting) from the config fields; False, False where the levers don't apply."""
    if algorithm not in ONLINE or not available():
        return False, False
    from ..models.tiled_mlp import validate_tiled_mlp
    from ..ops.row_groups import validate_rows_per_group

    rows = validate_rows_per_group(values.get(fields.ROWS_PER_GROUP, fields.default(fields.ROWS_PER_GROUP)))
    return rows, validate_tiled_mlp(values.get(fields.TILED_MLP, fields.default(fields.TILED_MLP)))


def padding_free_setting(algorithm: str, values: dict):
    """The `slimrl_padding_free` setting (False where it does not apply)."""
    if algorithm not in ONLINE or not available():
        return False
    from ..ops.row_groups import validate_padding_free

    return validate_padding_free(values.get(fields.PADDING_FREE, fields.default(fields.PADDING_FREE)))


def row_groups_choice(setting, rows: int, row_tokens: int, device: str):
    """The run's decision (slimrl.models.long_context.row_groups_choice), or None where the levers don't exist."""
    if not available():
        return None
    from ..models.long_context import row_groups_choice

    return row_groups_choice(setting, device, rows, row_tokens)


def group_rows(setting, rows: int, row_tokens: int, device: str) -> int:
    """Rows of the largest group a micro-batch of `rows` rows of `row_tokens` tokens is scored in on `device`."""
    choice = row_groups_choice(setting, rows, row_tokens, device)
    if choice is None or not choice.on or rows <= 1:
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


def _row_groups_line(r) -> str:
    if r.algorithm not in ONLINE or not available():
        return "off: TRL's one forward over the micro-batch (row groups are GRPO/RLOO's)"
    tokens = r.prompt_length + r.completion_length
    choice = row_groups_choice(r.rows_per_group, r.batch, tokens, r.device)
    if not choice.on:
        return f"off: {choice.reason}"
    if r.policy_rows >= r.batch:
        return f"on, one group of {r.batch} rows ({choice.reason}; rows of {tokens:,})"
    return f"on: {r.policy_rows} of {r.batch} rows a forward and backward ({choice.reason}; rows of {tokens:,})"


def _tiled_mlp_line(m, r, tokens: int) -> str:
    if r.tiled_mlp is False or not available():
        return "off" + (f": {fields.TILED_MLP}=False" if r.algorithm in ONLINE and available() else "")
    from ..models.long_context import tiled_mlp_choice

    choice = tiled_mlp_choice(r.tiled_mlp, m.hidden, m.intermediate, tokens, r.act_bytes)
    return f"{'on' if choice.on else 'off'}: {choice.reason}"


def _offload_line(r, host_bytes: int) -> str:
    if r.offload_moves and not host_bytes:
        return "on, moving nothing: block inputs under the offloader's min_bytes stay on the device"
    if r.checkpointing == "offload":
        return (
            f"on: block inputs in host memory, {host_bytes / 1024**2:,.0f} MiB of it "
            "(use_gradient_checkpointing='offload')"
            if r.offload_moves
            else "asked, but a CPU run has no device memory to free: costs what checkpointing does"
        )
    if r.checkpointing is False:
        return "off: no gradient checkpointing (nothing saved to offload)"
    return "off: opt-in, use_gradient_checkpointing='offload' (named below when it is what fits)"


def _padding_free_line(r) -> str:
    if r.padding_free is False or not available():
        return "off" + (f": {fields.PADDING_FREE}=False" if r.algorithm in ONLINE and available() else "")
    from ..models.long_context import padding_free_choice

    tokens = r.prompt_length + r.completion_length
    choice = padding_free_choice(r.padding_free, r.device, r.batch, tokens, r.rows_per_group)
    if not choice.on:
        return f"off: {choice.reason}"
    return f"on ({choice.reason}): the plan counts rows at full length"


def describe(p, tokens: int, host_bytes: int) -> list[str]:
    """The plan's "long-context levers" block: which are on for this plan, and why (`slimrl plan` prints it); `tokens`:
    one policy forward's, `host_bytes`: the offloaded inputs' (planning/terms.py)."""
    m, r = p.model, p.run
    rows = [
        ("row groups", _row_groups_line(r)),
        ("tiled MLP", _tiled_mlp_line(m, r, tokens)),
        ("offload", _offload_line(r, host_bytes)),
        ("padding-free", _padding_free_line(r)),
    ]
    return ["  long-context levers"] + [f"    {name:<14}{text}" for name, text in rows]
