"""The algorithm families are written once, in slimrl/families.py: no other module of src/slimrl holds a literal
tuple, list or set of two or more algorithm names (a planted one must be found)."""

from __future__ import annotations

import ast
from pathlib import Path

from slimrl import families
from slimrl.patches import registry

SRC = Path(__file__).parents[1] / "src" / "slimrl"
NAMES = set(registry.ALGORITHMS)  # every algorithm slimrl patches, by its PatchFastRL name


def family_literals(source: str) -> list[tuple[int, tuple[str, ...]]]:
    """Each literal tuple/list/set holding two or more algorithm names among its strings (other elements, such as a
    starred family, do not hide it), by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(NAMES.intersection(values)) >= 2:
                found.append((node.lineno, tuple(values)))
    return found


def test_family_tuples_live_only_in_families_py():
    problems = {
        str(path.relative_to(SRC)): literals
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "families.py" and (literals := family_literals(path.read_text()))
    }
    assert problems == {}


def test_the_check_finds_a_planted_family_tuple():
    planted = 'def f(a):\n    return a in ("grpo", "rloo")\n'
    assert family_literals(planted) == [(2, ("grpo", "rloo"))]
    assert family_literals('X = (*ONLINE, "online_dpo", "a2po")\n') == [(1, ("online_dpo", "a2po"))]
    assert family_literals('X = ("grpo", "parse_grpo_args")\n') == []  # one algorithm name is no family


def test_families_hold_what_their_names_say():
    assert families.ONLINE == ("grpo", "rloo") and set(families.SHARED_PREFIX) == {"grpo", "rloo", "dpo"}
    assert set(families.PAIRED) | set(families.UNPAIRED) <= set(families.PLANNED)
    assert set(families.NO_REFERENCE) <= set(families.PAIRED)
