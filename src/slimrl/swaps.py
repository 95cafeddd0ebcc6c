"""Every change slimrl makes to an object it does not own goes through this module, recorded on the object.

  swap(obj, name, value, why)          an instance attribute set (a method swapped, an attribute added), the value it
                                       replaced kept; `restore(obj, name)` puts it back (or removes an added one)
  set_field(args, name, value, why)    a field of a TRL config written (its old value kept the same way)
  adjust_default(args, name, value, why)
                                       the one way slimrl changes a config default: only where the user did not set
                                       the field (the one test: slimrl.state.user_set), else nothing; True if changed
  adopt(obj, name, original, why)      record a change another library's function already made (Liger-Kernel's
                                       apply_* functions), with the value it replaced: `restore` undoes it the same way
  swapped(obj)                         name -> why, for `slimrl.describe` (which adds the registry's class patches)
  latest_why(obj, name)                the why of the latest change of `obj.name` (None: none recorded)
  wears(obj, name, why)                whether `obj.name` holds, or wraps, a swap made for `why` (still in place)
  scoring_layer(objects, name, layer, make)
                                       one of SCORING_LAYERS over `obj.name` of each object while a call runs (the
                                       scoring seams' padding-free forward, shared prefix, shared images): at most
                                       once per object, only over the layers before it, restored on the way out
  swapped_modules()                    "module.name" -> why of the swaps on Python modules (a module-level function)
  RunValue(name, default, why)         a module-level value set while a call runs (a ContextVar): `.get()`,
                                       `with value.bound(x):` (set, then reset on the way out)
  ProcessValue(name, default, why)     a module-level value set once for the process (the import hook, the version
                                       check): `.get()`, `.set(x)`
  run_values()                         name -> (why, current value) of every one of the two above, for `describe`

The registry's class-level patches (slimrl.patches.registry) are the only other way slimrl changes a foreign object;
tests/test_swaps.py finds no other `setattr`, `types.MethodType` or method assignment on a foreign object in src/,
and no `global` statement, `ContextVar` or ContextVar `.set(` outside this module: every module-level value slimrl
writes at run time is one of the RunValue / ProcessValue objects, listed by `run_values()`.

Choices:
- The record is a dict on the object itself (slimrl.state.swap_records), so it travels with `copy.deepcopy` and goes
  away with the object. Swaps of one name nest (a stack): a `restore` undoes the latest one only, so a wrapper put
  over a swapped method for a while (the shared-prefix forward over the fused head) comes off leaving the first.
- Values are set with `setattr` (nn.Module keeps a plain value in the instance `__dict__`).
- Whether an object already wears a change is read from its records (`wears`), never from a mark set on the
  installed function: a record names the value it installed, so records that no longer describe the attribute (it
  was set again by someone else) count as not worn.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from dataclasses import dataclass
from typing import Any

from .state import swap_records, user_set


class _Missing:
    """The attribute was not the object's own before the swap (inherited from its class, or absent). One instance:
    `copy.deepcopy` and pickle give back the same object (a record copied with its model still restores)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return "MISSING"  # pickle and copy: the module's own MISSING

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
_MODULES: dict[str, types.ModuleType] = {}  # the Python modules a swap was recorded on, for `swapped_modules`


@dataclass
class Swap:
    """One recorded change: why it was made, what the object's own attribute held before and (a swap) what the
    change put there."""

    why: str
    original: Any
    value: Any = MISSING


def _push(obj, name: str, why: str, original, value=MISSING) -> None:
    if isinstance(obj, types.ModuleType):
        _MODULES[obj.__name__] = obj
    swap_records(obj).setdefault(name, []).append(Swap(why, original, value))


def swap(obj, name: str, value, why: str) -> None:
    """Set `obj.name = value` as the object's own attribute, recording what it replaces."""
    _push(obj, name, why, vars(obj).get(name, MISSING), value)
    setattr(obj, name, value)


def adopt(obj, name: str, original, why: str) -> None:
    """Record that `obj.name` was already changed (by another library's function) from `original` (MISSING: it was
    not the object's own), so that `restore(obj, name)` undoes it and `swapped` lists it."""
    _push(obj, name, why, original)


def restore(obj, name: str) -> None:
    """Undo the latest `swap(obj, name, ...)` / `set_field`: the value before it back, or an added attribute removed
    (no-op if nothing is recorded)."""
    records = swap_records(obj, create=False)
    stack = None if records is None else records.get(name)
    if not stack:
        return
    record = stack.pop()
    if not stack:
        del records[name]
    if record.original is MISSING:
        if name in vars(obj):
            delattr(obj, name)
    else:
        setattr(obj, name, record.original)


def set_field(args, name: str, value, why: str) -> None:
    """Write the config field `name` (recorded with its previous value)."""
    _push(args, name, why, getattr(args, name, MISSING))
    setattr(args, name, value)


def adjust_default(args, name: str, value, why: str) -> bool:
    """Change the config field `name` to `value` unless the user set it; True when it was changed."""
    if user_set(args, name) or getattr(args, name, MISSING) == value:
        return False
    set_field(args, name, value, why)
    return True


def swapped(obj) -> dict[str, str]:
    """name -> why of every recorded change on `obj` (nested swaps of one name joined, first to last)."""
    records = swap_records(obj, create=False) or {}
    return {name: "; then ".join(record.why for record in stack) for name, stack in records.items()}


def latest_why(obj, name: str) -> str | None:
    """The why of the latest recorded change of `obj.name` (None: none recorded)."""
    stack = (swap_records(obj, create=False) or {}).get(name)
    return stack[-1].why if stack else None


def wears(obj, name: str, why: str) -> bool:
    """Whether `obj.name` holds a swap made for `why`, or a later swap over it: the latest recorded swap of `name` is
    what the object's attribute holds (else the records no longer describe it: False)."""
    stack = (swap_records(obj, create=False) or {}).get(name)
    if not stack or vars(obj).get(name, MISSING) is not stack[-1].value:
        return False
    return any(record.why == why for record in stack)


# The layers a patched trainer puts over its models while a log-prob call runs, innermost first (each is the why its
# swap records). Each goes on at most once per object, and never over a layer after it here: a nested seam finds the
# layer its outer seam installed and leaves it.
PADDING_FREE_LAYER = "padding-free forward (row groups)"
SHARED_PREFIX_LAYER = "prompts forwarded once (shared prefix)"
SHARED_IMAGES_LAYER = "each distinct image encoded once (shared images)"
SCORING_LAYERS = (PADDING_FREE_LAYER, SHARED_PREFIX_LAYER, SHARED_IMAGES_LAYER)


@contextlib.contextmanager
def scoring_layer(objects, name: str, layer: str, make, own: bool = True):
    """While the body runs, `obj.name = make(obj, current)` on each distinct object of `objects` (`current`: what
    `obj.name` gives now; `make` returns None to leave that object alone), restored afterwards, exception or not.
    Left alone: an object wearing `layer` or a layer after it in SCORING_LAYERS, and with `own`, one whose `name`
    is not its own attribute (the fused head TRL installs on the model instance). Yields the objects changed."""
    later = SCORING_LAYERS[SCORING_LAYERS.index(layer) :]
    installed = []
    for obj in objects:
        if obj is None or any(obj is done for done in installed) or (own and vars(obj).get(name) is None):
            continue
        if any(wears(obj, name, other) for other in later):
            continue
        value = make(obj, getattr(obj, name))
        if value is not None:
            swap(obj, name, value, layer)
            installed.append(obj)
    try:
        yield installed
    finally:
        for obj in reversed(installed):
            restore(obj, name)


def swapped_modules() -> dict[str, str]:
    """ "module.name" -> why of every recorded change on a Python module (a module-level function swapped)."""
    return {f"{module}.{name}": why for module, obj in _MODULES.items() for name, why in swapped(obj).items()}


_RUN_VALUES: dict[str, RunValue | ProcessValue] = {}  # every module-level value slimrl writes at run time


class RunValue:
    """A module-level value set for the duration of a call (a ContextVar: each thread and task sees its own)."""

    def __init__(self, name: str, default, why: str):
        if name in _RUN_VALUES:
            raise ValueError(f"a run-time value named {name!r} is already declared")
        self.name, self.default, self.why = name, default, why
        self._var = contextvars.ContextVar(f"slimrl_{name}", default=default)
        _RUN_VALUES[name] = self

    def get(self):
        return self._var.get()

    @contextlib.contextmanager
    def bound(self, value):
        """`value` while the body runs, the value before it afterwards (exception or not)."""
        token = self._var.set(value)
        try:
            yield value
        finally:
            self._var.reset(token)


class ProcessValue:
    """A module-level value set for the rest of the process (every thread sees it)."""

    def __init__(self, name: str, default, why: str):
        if name in _RUN_VALUES:
            raise ValueError(f"a run-time value named {name!r} is already declared")
        self.name, self.default, self.why = name, default, why
        self._value = default
        _RUN_VALUES[name] = self

    def get(self):
        return self._value

    def set(self, value) -> None:
        self._value = value


def run_values(changed_only: bool = False) -> dict[str, tuple[str, Any]]:
    """name -> (why, current value) of every declared run-time value (only those off their default if asked)."""
    return {
        name: (value.why, value.get())
        for name, value in _RUN_VALUES.items()
        if not changed_only or value.get() is not value.default
    }
