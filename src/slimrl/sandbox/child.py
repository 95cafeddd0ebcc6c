"""The program of a sandbox process: a fresh `python -I -S` interpreter whose module path is this folder only
(stdlib only; `wire` and `kernel` are its siblings, imported as top-level modules).

1. Reads its settings (one frame on fd 0), imports the allowed modules (nothing can be read from disk later), locks
   itself down (kernel.lock_down) and answers ("ready", status of each layer).
2. Reads the function's source, defines it in a namespace holding only the sandbox's builtins, answers ("defined",).
3. Serves calls: ("ok", result, output) or ("error", type name, message, output), `output` being what the function
   printed (capped). It exits when fd 0 closes; the trainer stops it with SIGKILL at its time limit.
"""

from __future__ import annotations

import builtins
import importlib
import io
import sys
import types

import guards
import kernel
import wire

_IN, _OUT = 0, 1


class _CappedOutput(io.StringIO):
    """What the function prints, kept up to a limit."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def write(self, text: str) -> int:
        room = self.limit - self.tell()
        if room > 0:
            super().write(text[:room] if len(text) <= room else text[:room] + "\n[output cut at the sandbox's limit]\n")
        return len(text)

    def take(self) -> str:
        text = self.getvalue()
        self.seek(0)
        self.truncate()
        return text


def _module_views(modules: dict, hidden: dict) -> dict:
    """A read-only-by-convention namespace per allowed module: public attributes, sub-modules only when allowed."""
    views: dict = {}
    for name in sorted(modules, key=lambda n: -n.count(".")):  # sub-modules first: their parents point at them
        fields = {}
        for key, value in vars(modules[name]).items():
            if key.startswith("_") or key in hidden.get(name, ()):
                continue
            if isinstance(value, types.ModuleType):
                if value.__name__ in views:
                    fields[key] = views[value.__name__]
                continue
            fields[key] = value
        views[name] = types.SimpleNamespace(**fields)
    return views


def _define(request: dict, settings: dict, views: dict):
    code = compile(request["source"], "<model code>", "exec", flags=request["annotations_flag"], dont_inherit=True)
    table = (
        guards.sandbox_builtins(vars(builtins), settings, views) if settings["interpreter_policy"] else vars(builtins)
    )
    module = sys.modules["sandbox"] = types.ModuleType("sandbox")  # what dataclasses & co. look classes up in
    namespace = module.__dict__
    namespace["__builtins__"] = table
    exec(code, namespace)
    return namespace.pop(request["name"])  # the function sees no globals, not even itself (as in Unsloth)


def _send(message) -> None:
    try:
        data = wire.dump(message)
    except wire.NotPlainData as exc:
        data = wire.dump(("error", "TypeError", f"the function returned a value that is not plain data: {exc}",
                          message[-1]))  # fmt: skip
    wire.write_frame(_OUT, data)


def _serve(function, output: _CappedOutput) -> None:
    while True:
        try:
            request = wire.load(wire.read_frame(_IN))
        except EOFError:
            return
        try:
            result = function(*request["args"], **request["kwargs"])
        except BaseException as exc:  # the function's own failure, whatever it raised, is reported, not fatal
            _send(("error", type(exc).__name__, str(exc)[:2000], output.take()))
            continue
        _send(("ok", result, output.take()))


def _forget_setup_modules() -> None:
    """Drop what only the set-up needed (ctypes, the lock-down's libc handles) from places model code could walk
    to: this module's globals and sys.modules. The modules the serving loop needs (wire: os, pickle) stay."""
    globals().pop("kernel", None)
    globals().pop("importlib", None)
    for name in ("kernel", "ctypes", "ctypes._endian", "_ctypes", "importlib", "importlib.util", "importlib.machinery"):
        sys.modules.pop(name, None)


def main() -> None:
    settings = wire.load(wire.read_frame(_IN))
    output = _CappedOutput(settings["output_limit"])
    sys.stdout = sys.stderr = output
    modules = {}
    for name in (*settings["allowed_modules"], *settings["preload"]):
        try:
            modules[name] = importlib.import_module(name)
        except ImportError:
            continue
    views = _module_views({n: m for n, m in modules.items() if n in settings["allowed_modules"]},
                          settings["refused_module_attributes"])  # fmt: skip
    if settings["interpreter_policy"]:
        guards.guard_views(views)
    status = kernel.lock_down(settings["memory_bytes"], settings["cpu_seconds"], settings["layers"])
    _send(("ready", status))
    request = wire.load(wire.read_frame(_IN))
    _forget_setup_modules()
    if settings["interpreter_policy"]:
        sys.addaudithook(guards.audit_hook(settings))
    try:
        function = _define(request, settings, views)
    except BaseException as exc:
        _send(("error", type(exc).__name__, str(exc)[:2000], output.take()))
        return
    _send(("defined", output.take()))
    _serve(function, output)
