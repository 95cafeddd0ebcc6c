"""The config side of every patched trainer's set-up (trainer_setup.py has the trainer side):

1. Config `__init__`: slimrl's config fields are accepted as keywords and set before the dataclass `__init__`, so
   `__post_init__` and TRL's checks see them, each a row of slimrl.fields: every config's (`slimrl_num_chunks`,
   with Unsloth's alias `unsloth_num_chunks`, the knob of slimrl.ops.chunking; the memory budget) and the family's.
   Fields an older script passes under a name TRL 1.16 renamed are taken under the new name with a notice (both
   given and different: an error naming both); fields TRL removed get an error saying what replaced them. The
   fields the user passed are recorded (slimrl.state.ConfigState): slimrl may adjust a TRL default but never a
   value the user set.
2. Config class: each slimrl field's default as a class attribute (config_default_patches), so a config built
   before patching, by `dataclasses.replace` or a parser reads slimrl's defaults. Config `__post_init__`: precision
   flags resolved where TRL's default cannot run (precision.py), then `use_cpu` for a multi-process launch without an
   accelerator (distributed.py), every numeric field against its meaningful range (config_ranges.py), the family's
   config checks, then TRL's own (the clearer message wins).
"""

from __future__ import annotations

import functools
from typing import Any

from ... import fields
from ...ops.chunking import validate_num_chunks
from ...state import AUTO_CHUNKS, config_state
from ...swaps import set_field
from ...training import budget
from ..compat import adapt_config_kwargs
from ..family import Family
from ..seams import Patch
from . import distributed, precision
from .config_ranges import check_ranges

SLIMRL_FIELD = "a slimrl field"  # what slimrl.describe says of the fields the patched __init__ sets
# (name, default) of every patched config's fields taken as plain keywords (the knob, with its alias, apart)
SHARED_CONFIG_FIELDS = tuple(pair for pair in fields.every_config() if pair[0] != fields.NUM_CHUNKS)


def num_chunks_from(slimrl_num_chunks, unsloth_num_chunks) -> int:
    """The knob from slimrl's field and Unsloth's alias (AUTO when neither is set; both set and different: error)."""
    if slimrl_num_chunks is not None and unsloth_num_chunks is not None and slimrl_num_chunks != unsloth_num_chunks:
        raise ValueError(
            f"slimrl_num_chunks={slimrl_num_chunks} and its alias unsloth_num_chunks={unsloth_num_chunks} disagree: "
            "set one of them."
        )
    value = slimrl_num_chunks if slimrl_num_chunks is not None else unsloth_num_chunks
    return validate_num_chunks(AUTO_CHUNKS if value is None else value)


def config_init_maker(family: Family):
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, slimrl_num_chunks=None, unsloth_num_chunks=None, **kwargs):
            adapt_config_kwargs(type(self), kwargs, family.renamed_fields, family.removed_fields)
            extras = {name: kwargs.pop(name, default) for name, default in keyword_fields(family)}
            set_field(self, fields.NUM_CHUNKS, num_chunks_from(slimrl_num_chunks, unsloth_num_chunks), SLIMRL_FIELD)
            for name, value in extras.items():
                set_field(self, name, value, SLIMRL_FIELD)
            config_state(self).user_fields = frozenset(kwargs)
            original(self, *args, **kwargs)

        return __init__

    return make


def keyword_fields(family: Family) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the slimrl fields a config of `family` takes as plain keywords (the knob has an alias)."""
    return (*SHARED_CONFIG_FIELDS, *family.config_fields)


def config_defaults(family: Family) -> tuple[tuple[str, Any], ...]:
    """(name, default) of every slimrl field a patched config of `family` has: the one place its defaults live."""
    return ((fields.NUM_CHUNKS, fields.default(fields.NUM_CHUNKS)), *keyword_fields(family))


def config_default_patches(family: Family, config_path: str) -> list[Patch]:
    """Each slimrl field's default as a class attribute of the config: a config built before patching, through
    `dataclasses.replace` or a parser reads the default wherever slimrl reads the field (an instance value wins)."""

    def default_of(value):
        return lambda _missing: value

    return [
        Patch(config_path, name, None, default_of(default), doc=f"default {name}={default!r}", creates=True)
        for name, default in config_defaults(family)
    ]


def config_post_init_maker(family: Family):
    def make(original):
        @functools.wraps(original)
        def __post_init__(self):
            given = getattr(self, budget.BUDGET_FIELD)
            validated = budget.validate_memory_budget(given)
            if validated is not given:  # a number of GiB as a float
                set_field(self, budget.BUDGET_FIELD, validated, "validated")
            precision.resolve_config_precision(self)
            distributed.resolve_config_device(self)
            distributed.resolve_pin_memory(self)
            check_ranges(self)  # every numeric field against its meaningful range (config_ranges.py)
            family.check_config(self)
            original(self)

        return __post_init__

    return make
