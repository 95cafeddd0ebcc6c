"""slimrl's own config fields, written once: one row each (name, default, CLI alias, families, help) in `TABLE`.

Every other module names a field by its constant here (`fields.NUM_CHUNKS`), never by its spelling
(tests/test_fields.py finds no other string equal to a field's name under src/slimrl). The rows are read by:
the trainer families' declarations (`declared_by`, patches/trainers/), the config set-up (`every_config`,
patches/setup/config_setup.py), the CLI's flags and their help (`flag_rows`, cli/args.py), the planner
(planning/run.py, planning/levers.py) and `slimrl.describe` (description.py).

Choices:
1. A field's validator stays beside the op it guards (ops/chunking.py, ops/row_groups.py, models/tiled_mlp.py,
   training/budget.py, patches/rollouts/rewards.py, ...), importing the name from here. Adding a field is one row
   here plus its validator.
2. `families` are the algorithm names of slimrl.families (the `PatchFastRL` / CLI spellings); `EVERY`: every patched
   config has the field (set by the config set-up itself, not declared by a family).
3. `flag_type`: the type of the field's flag on every `slimrl` training command whose algorithm the row's families
   name (None: no flag); `alias`: the flag's second spelling, where there is one; `choices`: the values the flag
   accepts, where they are a fixed set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .families import ONLINE, PAIRED, REWARD_FUNCTIONS
from .state import AUTO_CHUNKS

AUTO = "auto"
EVERY = ("every patched config",)  # `families` of a field every patched config has

NUM_CHUNKS = "slimrl_num_chunks"
MAX_MEMORY_GB = "slimrl_max_memory_gb"
VLLM_SAMPLING_PARAMS = "vllm_sampling_params"
VLLM_SERVER_SYNC = "vllm_server_sync"
REWARD_ERRORS = "slimrl_reward_errors"
SHARED_PREFIX = "slimrl_shared_prefix"
ROWS_PER_GROUP = "slimrl_rows_per_group"
PADDING_FREE = "slimrl_padding_free"
TILED_MLP = "slimrl_tiled_mlp"


@dataclass(frozen=True)
class ConfigField:
    """One of slimrl's config fields (module docstring)."""

    name: str
    default: Any
    families: tuple[str, ...]
    help: str
    alias: str | None = None
    flag_type: Any = None
    choices: tuple | None = None


TABLE = (
    ConfigField(
        NUM_CHUNKS,
        AUTO_CHUNKS,
        EVERY,
        "Chunks of the log-prob head: -1 = automatic (bounded scratch memory), N >= 1 = the scored tokens in N chunks "
        "(less memory, same numbers).",
        flag_type=int,
    ),
    ConfigField(
        MAX_MEMORY_GB,
        None,
        EVERY,
        "Stop (keeping the last step's checkpoint) when a step's measured peak memory exceeds this many GiB (peak RSS "
        "on CPU, allocated memory on CUDA); `slimrl plan` says what a run needs.",
        alias="--max_memory_gb",
        flag_type=float | None,
    ),
    ConfigField(VLLM_SAMPLING_PARAMS, None, ONLINE, "Rollouts on the model's vLLM engine with these sampling params."),
    ConfigField(VLLM_SERVER_SYNC, AUTO, ONLINE, "How weights reach a vLLM server: 'auto', 'merged' or 'lora'."),
    ConfigField(
        REWARD_ERRORS,
        "raise",
        REWARD_FUNCTIONS,
        "A reward function that raises or returns an unusable value: 'raise' stops with the function, prompt and "
        "completion named; 'skip' scores that completion NaN and counts it (metric rewards/<name>/errors).",
        flag_type=str,
        choices=("raise", "skip"),
    ),
    ConfigField(SHARED_PREFIX, AUTO, (*ONLINE, *PAIRED), "Each prompt computed once per group: 'auto', True or False."),
    ConfigField(ROWS_PER_GROUP, AUTO, ONLINE, "Rows scored per forward and backward: 'auto', False or a number."),
    ConfigField(PADDING_FREE, AUTO, ONLINE, "Forwards without their all-padding columns: 'auto', True or False."),
    ConfigField(TILED_MLP, AUTO, ONLINE, "The MLP run in token shards: 'auto', True, False or shard tokens."),
)
BY_NAME = {row.name: row for row in TABLE}
NAMES = frozenset(BY_NAME)


def default(name: str):
    """The field's default (the value a config nobody set it on reads)."""
    return BY_NAME[name].default


def declared_by(algorithms: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the fields a family of `algorithms` declares: the rows that apply to each of them."""
    return tuple((row.name, row.default) for row in TABLE if set(algorithms) <= set(row.families))


def every_config() -> tuple[tuple[str, Any], ...]:
    """(name, default) of the fields every patched config has."""
    return tuple((row.name, row.default) for row in TABLE if row.families == EVERY)


def flag_rows(algorithm: str | None = None) -> tuple[ConfigField, ...]:
    """The rows that are flags of the training commands: every command's (no `algorithm`), or `algorithm`'s own."""
    return tuple(
        row
        for row in TABLE
        if row.flag_type is not None and (algorithm in row.families if algorithm else row.families == EVERY)
    )
