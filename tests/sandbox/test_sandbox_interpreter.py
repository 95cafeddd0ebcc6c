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
