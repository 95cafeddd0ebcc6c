"""check_python_modules and create_locked_down_function's source checks: Unsloth's verdicts on its notebooks' samples,
and what slimrl refuses besides (no process is started here)."""

import pytest

from slimrl import check_python_modules, create_locked_down_function
from slimrl.sandbox import policy

NOTEBOOK_OK = """
def strategy(board):
    import math
    from typing import Callable
    return "W"
"""
NOTEBOOK_NUMPY = """
def strategy(board):
    from numpy import matmul
    return "W"
"""


def test_notebook_samples_get_unsloths_verdicts():
    ok, info = check_python_modules(NOTEBOOK_OK)
    assert ok and info["stdlib"] == ["math", "typing"] and info["non_stdlib"] == [] and info["refused"] == []
    ok, info = check_python_modules(NOTEBOOK_NUMPY)
    assert not ok and info["non_stdlib"] == ["numpy"] and "numpy" in info["refused"][0]
    ok, info = check_python_modules("def a")
    assert not ok and info["error"].startswith("SyntaxError")  # the notebooks test `"error" in info`


@pytest.mark.parametrize(
    "body, refused",
    [
        ("import os\n    return os.getcwd()", "import os"),
        ("import subprocess\n    return 1", "import subprocess"),
        ("from socket import socket\n    return 1", "import socket"),
        ("return open('/etc/passwd').read()", "open()"),
        ("return eval('1')", "eval()"),
        ("return ().__class__.__base__.__subclasses__()", ".__class__"),
        ("return (x for x in ()).gi_frame.f_back.f_globals", ".gi_frame"),
        ("return __builtins__", "the name __builtins__"),
        ("from . import x\n    return x", "relative import"),
        ("import random\n    return random._os", "._os"),
    ],
)
def test_escape_attempts_are_refused_with_their_line(body, refused):
    code = f"def f(board):\n    {body}\n"
    ok, info = check_python_modules(code)
    assert not ok
    assert any(refused in item and item.startswith("line ") for item in info["refused"]), info["refused"]
    with pytest.raises(RuntimeError, match="refuses"):
        create_locked_down_function(code)


def test_a_local_named_like_a_refused_builtin_is_fine():
    code = "def f(board):\n    input = board[0]\n    vars = [input]\n    return vars\n"
    assert check_python_modules(code) == (True, {"stdlib": [], "non_stdlib": [], "relative_imports": 0, "refused": []})


@pytest.mark.parametrize(
    "code, message",
    [
        ("def a(x):\n    return x\ndef b(x):\n    return x\n", "exactly one"),
        ("x = 1\n", "exactly one"),
        ("async def a(x):\n    return x\n", "exactly one"),
        ("@staticmethod\ndef a(x):\n    return x\n", "Decorators"),
        ("def a(x=print('defined')):\n    return x\n", "literal default"),
        ("def a(x)\n    return x\n", "SyntaxError"),
        ("def a():\n    nonlocal y\n    return y\n", "SyntaxError"),  # only the compiler sees it
    ],
)
def test_only_one_plain_function_is_accepted(code, message):
    with pytest.raises(RuntimeError, match=message):
        create_locked_down_function(code)


def test_docstring_nested_functions_and_literal_defaults_are_accepted():
    code = '"""A strategy."""\ndef add(a, b=-1, *, c=(1, "x")):\n    def adder(a):\n        return a + b\n'
    code += "    return adder(b) + b\n"
    assert create_locked_down_function(code).__name__ == "add"  # no process started: checking the source only


def test_allowed_modules_are_stdlib_and_import_no_os_through_their_views():
    stdlib = {m.split(".")[0] for m in policy.ALLOWED_MODULES}
    ok, info = check_python_modules("".join(f"import {m}\n" for m in policy.ALLOWED_MODULES))
    assert ok and set(info["stdlib"]) == stdlib and info["non_stdlib"] == []
    assert not {"os", "sys", "subprocess", "socket", "ctypes", "importlib", "builtins", "gc", "inspect"} & stdlib
