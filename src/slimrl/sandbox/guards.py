"""The interpreter layer at run time, inside a sandbox process (stdlib only: imported by child.py as a top-level
module). Its module globals hold no module that reaches the operating system: model code that reached a guard's
globals would find `unicodedata` and the lists below, not `os` or `sys`.

- sandbox_builtins(): the builtins model code sees: the real ones minus the refused, with `__import__` answering module
  views only, and `getattr` / `hasattr` / `setattr` / `delattr` refusing private, dunder, frame and format names
  (NFKC-normalised first, as the parser normalises identifiers).
- guard_views(): dataclasses' functions check the field names they will write into generated source.
- audit_hook(): a PEP 578 audit hook refusing every event that touches the operating system (files, processes,
  sockets, imports, ctypes, gc, tracing) and reads of frame and code attributes. It runs whatever reached them:
  code past the other checks (a dataclass built from a crafted namespace, say) still cannot open a file or run a
  program, even where Landlock or seccomp is missing. Hooks cannot be removed once added.
"""

from __future__ import annotations

import keyword
import unicodedata

_FORMAT_METHODS = ("format", "format_map")


def sandbox_builtins(real: dict, settings: dict, views: dict) -> dict:
    """The builtins table for model code, built from the interpreter's `real` builtins."""
    refused = frozenset(settings["refused_attributes"]) | frozenset(_FORMAT_METHODS)
    real_getattr, real_hasattr, real_setattr, real_delattr = (real[n] for n in ("getattr", "hasattr", "setattr",
                                                                                "delattr"))  # fmt: skip

    def check(name):
        if not isinstance(name, str):
            raise TypeError("attribute name must be a string")
        normal = unicodedata.normalize("NFKC", name)
        if normal.startswith("_") or normal in refused or name.startswith("_"):
            raise AttributeError(f"the attribute {name!r} is not available in the sandbox")
        return name

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or name not in views:
            raise ImportError(f"import of {name!r} is not allowed in the sandbox")
        return views[name] if fromlist else views[name.split(".")[0]]

    table = {k: v for k, v in real.items() if not k.startswith("__") or k == "__build_class__"}
    for name in settings["refused_builtins"]:
        table.pop(name, None)
    table.update(
        __import__=guarded_import,
        getattr=lambda obj, name, *default: real_getattr(obj, check(name), *default),
        hasattr=lambda obj, name: real_hasattr(obj, check(name)),
        setattr=lambda obj, name, value: real_setattr(obj, check(name), value),
        delattr=lambda obj, name: real_delattr(obj, check(name)),
    )
    return table


def _field_names(cls) -> list:
    """The field names the dataclasses module would write into generated source for `cls` (its annotations and
    every base's fields)."""
    if not isinstance(cls, type):
        return []
    names = list(dict(cls.__dict__.get("__annotations__", {})))
    for base in cls.__mro__:
        fields = dict(getattr(base, "__dataclass_fields__", None) or {})
        names += [*fields, *(getattr(field, "name", "") for field in fields.values())]
    return names


def _check_fields(cls) -> None:
    bad = [n for n in _field_names(cls) if not (isinstance(n, str) and n.isidentifier()) or keyword.iskeyword(n)
           or n.startswith("__")]  # fmt: skip
    if bad:
        raise TypeError(f"dataclass field names must be plain identifiers, got {bad[0]!r}")


def guard_views(views: dict) -> None:
    """Module views whose functions generate source from, or read attributes named by, data model code controls:
    dataclasses (field names go into the generated methods' source) check those names first."""
    view = views.get("dataclasses")
    if view is None:
        return
    real = {name: getattr(view, name) for name in ("dataclass", "make_dataclass", "asdict", "astuple", "replace")}

    def dataclass(cls=None, /, **options):
        def wrap(cls):
            _check_fields(cls)
            return real["dataclass"](cls, **options)

        return wrap if cls is None else wrap(cls)

    def make_dataclass(cls_name, fields, *, bases=(), **options):
        for base in bases:
            _check_fields(base)
        return real["make_dataclass"](cls_name, fields, bases=bases, **options)

    def checked(name):
        def call(obj, *args, **kwargs):
            _check_fields(type(obj))
            return real[name](obj, *args, **kwargs)

        return call

    view.dataclass, view.make_dataclass = dataclass, make_dataclass
    view.asdict, view.astuple, view.replace = checked("asdict"), checked("astuple"), checked("replace")


def audit_hook(settings: dict):
    """The audit hook refusing `settings`' events (a PermissionError naming the event)."""
    events = frozenset(settings["refused_events"])
    prefixes = tuple(settings["refused_event_prefixes"])
    frame_attributes = frozenset(settings["audited_frame_attributes"])

    def hook(event, args):
        if event in events or event.startswith(prefixes):
            raise PermissionError(f"{event} is not allowed in the sandbox")
        if event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attributes:
            raise PermissionError(f"the attribute {args[1]!r} is not available in the sandbox")

    return hook
