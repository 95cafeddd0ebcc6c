"""The interpreter layer at run time, inside the sandbox process: what passes the source checks still meets guarded
builtins and module views (computed attribute names, hidden module attributes), while ordinary code just runs."""

import pytest

from slimrl import create_locked_down_function
from slimrl.sandbox import SandboxError

PROBES = """
def probe():
    import collections.abc
    import dataclasses
    import json
    import string
    import typing
    from collections import Counter, abc

    def attempt(action):
        try:
            action()
            return "ran"
        except Exception as exc:
            return repr(exc).split("(")[0]

    @dataclasses.dataclass
    class Move:
        key: str
        score: int = 0

    return {
        "computed dunder": attempt(lambda: getattr((), "__cl" + "ass__")),
        "computed frame": attempt(lambda: getattr((x for x in ()), "gi_" + "frame")),
        "hasattr private": attempt(lambda: hasattr(json, "_" + "default_decoder")),
        "typing.sys": attempt(lambda: typing.sys),
        "typing.get_type_hints": attempt(lambda: typing.get_type_hints),
        "string.Formatter": attempt(lambda: string.Formatter),
        "ordinary code": [Move("W", 2).key, Counter("aab")["a"], isinstance([], collections.abc.Sequence),
                          abc is collections.abc, json.loads("[1, 2]")],
    }
"""


def test_guarded_builtins_and_module_views():
    results = create_locked_down_function(PROBES)()
    assert results == {
        "computed dunder": "AttributeError",
        "computed frame": "AttributeError",
        "hasattr private": "AttributeError",
        "typing.sys": "AttributeError",
        "typing.get_type_hints": "AttributeError",
        "string.Formatter": "AttributeError",
        "ordinary code": ["W", 2, True, True, [1, 2]],
    }


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    from operator import attrgetter\n    return 1\n",
        "def f():\n    import math\n    return math.sys\n",
    ],
)
def test_hidden_names_fail_at_run_time(source):
    with pytest.raises(SandboxError, match="ImportError|AttributeError"):
        create_locked_down_function(source)()


ORDINARY = """
def play(board):
    import collections
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Move:
        key: str
        score: "int" = 0

    class Tile:
        def __init__(self, value):
            self.value = value

        def __eq__(self, other):
            return self.value == other.value

    def best(moves: "list[Move]") -> "Move":
        return max(moves, key=lambda move: move.score)

    Point = collections.namedtuple("Point", "row col")
    found = []
    for row in board:
        match row:
            case [int(first), *rest] if first > 0:
                found.append(Point(board.index(row), first))
            case {"skip": True}:
                continue
    match Move("W", 3):
        case Move(key=key, score=score):
            pass
    text = "{0.row}-{0.col} {1[0]!r:>4} {2:.1f}".format(found[0], ["a"], 0.25)
    return [best([Move("A", 1), Move("D", 5)]).key, key, score, text, f"{len(found):02d}",
            Tile(2) == Tile(2), dataclasses.asdict(Move("S"))]
"""


def test_ordinary_code_near_the_refused_forms_still_runs():
    """Negative control for the source checks: keyword class patterns, self-matching positional ones, literal format
    strings with public fields, string annotations, dunder methods such as __init__, dataclasses and namedtuples."""
    play = create_locked_down_function(ORDINARY)
    assert play([[0, 1], [2, 3]]) == ["D", "W", 3, "1-2  'a' 0.2", "01", True, {"key": "S", "score": 0}]
    play.close()
