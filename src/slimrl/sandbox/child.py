"""The program of a sandbox process: a fresh `python -I -S` interpreter whose module path is this folder only
(stdlib only; `wire` and `kernel` are its siblings, imported as top-level modules).

1. Reads its settings (one frame on fd 0), imports the allowed modules (nothing can be read from disk later), locks
   itself down (kernel.lock_down) and answers ("ready", status of each layer).
2. Reads the function's source, defines it in a namespace holding only the sandbox's builtins (with the interpreter
   layer on, after adding guards.py's audit hook), drops every module from this module's globals and the set-up's
   modules from sys.modules, answers ("defined",).
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


def _receiver(load, read):
    """receive(): the next frame from the trainer, unpickled as plain data."""
    return lambda: load(read(_IN))


def _sender(dump, write, not_plain):
    """send(message): one frame to the trainer; a result that is not plain data is reported as an error."""

    def send(message) -> None:
        try:
            data = dump(message)
        except not_plain as exc:
            data = dump(("error", "TypeError", f"the function returned a value that is not plain data: {exc}",
                         message[-1]))  # fmt: skip
        write(_OUT, data)

    return send


def _serve(function, output: _CappedOutput, receive, send) -> None:
    while True:
        try:
            request = receive()
        except EOFError:
            return
        try:
            result = function(*request["args"], **request["kwargs"])
        except BaseException as exc:  # the function's own failure, whatever it raised, is reported, not fatal
            send(("error", type(exc).__name__, str(exc)[:2000], output.take()))
            continue
        send(("ok", result, output.take()))


def _forget_modules() -> None:
    """Once the function is defined, drop what model code could walk to from the serving loop's frames: the
    set-up's modules (ctypes, the lock-down's libc handles) from sys.modules, and every module from this module's
    globals (the loop gets the functions it needs as arguments)."""
    for name in ("kernel", "ctypes", "ctypes._endian", "_ctypes", "importlib", "importlib.util", "importlib.machinery"):
        sys.modules.pop(name, None)
    namespace = globals()
    for name in [key for key, value in namespace.items() if isinstance(value, types.ModuleType)]:
        del namespace[name]


def main() -> None:
    receive = _receiver(wire.load, wire.read_frame)
    send = _sender(wire.dump, wire.write_frame, wire.NotPlainData)
    settings = receive()
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
    del modules
    if settings["interpreter_policy"]:
        guards.guard_views(views)
    send(("ready", kernel.lock_down(settings["memory_bytes"], settings["cpu_seconds"], settings["layers"])))
    request = receive()
    if settings["interpreter_policy"]:
        sys.addaudithook(guards.audit_hook(settings))
    try:
        function = _define(request, settings, views)
    except BaseException as exc:
        send(("error", type(exc).__name__, str(exc)[:2000], output.take()))
        return
    finally:
        _forget_modules()
    send(("defined", output.take()))
    _serve(function, output, receive, send)
