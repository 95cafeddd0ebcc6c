"""slimrl's config fields are written once, in slimrl/fields.py: no other module of src/slimrl holds a string literal
equal to a field's name (a planted one must be found), and what reads the table sees its rows."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from slimrl import families, fields

SRC = Path(__file__).parents[1] / "src" / "slimrl"


def field_literals(source: str) -> list[tuple[int, str]]:
    """Each string literal equal to one of slimrl's config field names, by line."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in fields.NAMES
    ]


def test_field_names_live_only_in_fields_py():
    problems = {
        str(path.relative_to(SRC)): literals
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "fields.py" and (literals := field_literals(path.read_text()))
    }
    assert problems == {}


def test_the_check_finds_a_planted_field_name():
    planted = 'def f(args):\n    return getattr(args, "slimrl_num_chunks", -1)\n'
    assert field_literals(planted) == [(2, "slimrl_num_chunks")]
    assert field_literals('X = f"slimrl_num_chunks={n}"\nY = "slimrl_num_chunks_old"\n') == []  # not the name itself


def test_one_row_per_name_and_families_by_their_names():
    assert len(fields.TABLE) == len(fields.NAMES)
    known = set(families.PLANNED) | {"online_dpo", "a2po"}
    for row in fields.TABLE:
        assert row.families == fields.EVERY or set(row.families) <= known, row.name
        assert row.help and "\n" not in row.help


def test_the_families_declare_their_rows():
    from slimrl.patches.trainers import a2po, offline, online, online_dpo

    declared = {name for name, _ in online.ONLINE.config_fields}
    assert declared >= {row.name for row in fields.TABLE if "grpo" in row.families}
    assert {name for name, _ in offline.SHARED_PREFIX_OFFLINE.config_fields} >= {fields.SHARED_PREFIX}
    assert dict(online_dpo.ONLINE_DPO.config_fields) == dict(a2po.A2PO.config_fields) == {fields.REWARD_ERRORS: "raise"}
    assert fields.NUM_CHUNKS not in declared and fields.MAX_MEMORY_GB not in declared  # every config's, not a family's


def test_the_cli_flags_come_from_the_table():
    from slimrl.cli.args import OnlineSlimrlArguments, SlimrlArguments

    every = {f.name: f for f in dataclasses.fields(SlimrlArguments)}
    online = {f.name: f for f in dataclasses.fields(OnlineSlimrlArguments)}
    assert set(every) == {fields.NUM_CHUNKS, fields.MAX_MEMORY_GB}
    assert set(online) == set(every) | {fields.REWARD_ERRORS}
    budget = every[fields.MAX_MEMORY_GB]
    assert budget.metadata["aliases"] == ["--max_memory_gb"] and budget.default is None
    assert online[fields.REWARD_ERRORS].metadata["choices"] == ["raise", "skip"]
