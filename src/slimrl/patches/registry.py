"""The one registry of slimrl's patches to TRL (`ALGORITHMS`), and `PatchFastRL` / `unpatch`.

Rules every patch follows (seams.py says what a patch is):
- Before anything is assigned, every seam of the requested algorithms is checked: the attribute exists and its
  parameters start with the names slimrl expects, and so do the TRL helpers it relies on. A moved seam or a TRL outside
  the supported range raises `PatchError` naming the seam and the installed TRL version; nothing is half-applied.
- Patching is idempotent, reversible (`unpatch()` puts back the very objects that were there) and independent of
  import order: classes are patched in place, so `from trl import GRPOTrainer` before or after sees the patch.
- Importing this module imports no TRL: the algorithm modules hold plain lists of dotted paths.
- Patching on import (on_import.py, called on `from slimrl import FastLanguageModel` as Unsloth patches TRL on import)
  applies each algorithm through `apply_on_import`, the same checked path as `PatchFastRL`, when a script imports its
  TRL modules (`trl_modules`, `trl_aliases`); `unpatch()` removes the hook (auto.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from . import auto
from .compat import REMOVED_ALGORITHMS
from .seams import MISSING, Patch, PatchError, check_seam, check_trl_version, own_attr, trl_version, unwrap_descriptor
from .trainers import (
    a2po,
    async_grpo,
    cpo,
    distillation,
    dpo,
    gkd,
    gmpo,
    gold,
    grpo,
    kto,
    online_dpo,
    orpo,
    ppo,
    reward,
    rloo,
    sft,
)

logger = logging.getLogger("slimrl")

__all__ = [
    "ALGORITHMS",
    "PatchFastRL",
    "unpatch",
    "is_patched",
    "applied_seams",
    "supported_algorithms",
    "PatchError",
    "Patch",
]

ALGORITHMS: dict[str, list[Patch]] = {
    "grpo": grpo.PATCHES,
    "rloo": rloo.PATCHES,
    "dpo": dpo.PATCHES,
    "kto": kto.PATCHES,
    "sft": sft.PATCHES,
    "reward": reward.PATCHES,
    "orpo": orpo.PATCHES,
    "cpo": cpo.PATCHES,
    "ppo": ppo.PATCHES,
    "gkd": gkd.PATCHES,
    "gold": gold.PATCHES,
    "distillation": distillation.PATCHES,
    "online_dpo": online_dpo.PATCHES,
    "gmpo": gmpo.PATCHES,
    "a2po": a2po.PATCHES,
    "async_grpo": async_grpo.PATCHES,
}


@dataclass
class _Applied:
    owner_obj: Any
    name: str
    original: Any  # what the owner's own __dict__ held (or MISSING when the attribute was inherited or absent)
    replacement: Any


@dataclass
class _State:
    applied: dict[str, _Applied] = field(default_factory=dict)  # seam -> record
    algorithms: set[str] = field(default_factory=set)


_STATE = _State()


def supported_algorithms() -> list[str]:
    return sorted(ALGORITHMS)


def _normalize(algorithm: str | None) -> list[str]:
    if algorithm is None:
        return supported_algorithms()
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a string or None, got {type(algorithm).__name__}")
    name = algorithm.strip().lower()
    if name in REMOVED_ALGORITHMS and name not in ALGORITHMS:
        raise ValueError(
            f"PatchFastRL({algorithm!r}): {REMOVED_ALGORITHMS[name]}. Supported: "
            f"{', '.join(supported_algorithms())} (or None for all)."
        )
    if name not in ALGORITHMS:
        raise ValueError(
            f"Unknown algorithm {algorithm!r}. Supported: {', '.join(supported_algorithms())} (or None for all)."
        )
    return [name]


def _apply(patch: Patch, owner_obj: Any) -> None:
    if patch.creates:
        if getattr(owner_obj, patch.name, MISSING) is not MISSING:  # TRL has it: nothing to add or remove
            return
        replacement = patch.make(None)
        setattr(owner_obj, patch.name, replacement)
        _STATE.applied[patch.seam] = _Applied(owner_obj, patch.name, MISSING, replacement)
        return
    original = own_attr(owner_obj, patch.name)
    current = getattr(owner_obj, patch.name)
    replacement = patch.make(unwrap_descriptor(current))
    if isinstance(original, (staticmethod, classmethod)) and not isinstance(replacement, type(original)):
        replacement = type(original)(replacement)
    fn = unwrap_descriptor(replacement)
    try:
        fn.__slimrl_original__ = unwrap_descriptor(current)
        fn.__slimrl_seam__ = patch.seam
    except (AttributeError, TypeError):
        pass
    setattr(owner_obj, patch.name, replacement)
    _STATE.applied[patch.seam] = _Applied(owner_obj, patch.name, original, replacement)


def PatchFastRL(algorithm: str | None = None, FastLanguageModel: Any = None) -> list[str]:  # noqa: N802, N803
    """Make TRL's trainers for `algorithm` ("grpo", "rloo", ...; case-insensitive; None = all) use slimrl's paths.

    `FastLanguageModel` is accepted for Unsloth compatibility and not needed. Returns the algorithms now patched.
    """
    return _patch(_normalize(algorithm))


def _patch(algorithms: list[str]) -> list[str]:
    check_trl_version()
    todo = [p for a in algorithms if a not in _STATE.algorithms for p in ALGORITHMS[a]]
    # Check every seam before assigning anything, so a moved seam leaves stock TRL untouched
    owners = [check_seam(p) for p in todo]
    for patch, owner_obj in zip(todo, owners):
        if patch.seam not in _STATE.applied:  # shared between algorithms: already in place
            _apply(patch, owner_obj)
    _STATE.algorithms.update(algorithms)
    logger.info("slimrl: patched TRL %s for %s", trl_version(), ", ".join(sorted(_STATE.algorithms)))
    return sorted(_STATE.algorithms)


def unpatch(algorithm: str | None = None) -> None:
    """Restore stock TRL exactly (all algorithms and the patching on import, or one algorithm)."""
    algorithms = _normalize(algorithm) if algorithm is not None else sorted(_STATE.algorithms)
    if algorithm is None:
        auto.uninstall()  # no more patching on import in this process
    else:
        auto.forget(algorithms)
    still_needed = {p.seam for a in _STATE.algorithms - set(algorithms) for p in ALGORITHMS[a]}
    leaving = {p.seam for a in algorithms for p in ALGORITHMS[a]}
    for seam, rec in list(_STATE.applied.items()):
        if seam in still_needed or seam not in leaving:
            continue
        if rec.original is MISSING:
            delattr(rec.owner_obj, rec.name)
        else:
            setattr(rec.owner_obj, rec.name, rec.original)
        del _STATE.applied[seam]
    _STATE.algorithms -= set(algorithms)


def is_patched(algorithm: str | None = None) -> bool:
    if algorithm is None:
        return bool(_STATE.algorithms)
    return algorithm.strip().lower() in _STATE.algorithms


def applied_seams() -> list[str]:
    return sorted(_STATE.applied)


def describe(algorithm: str) -> list[tuple[str, str]]:
    """(seam, what it changes) of every patch of `algorithm`."""
    return [(p.seam, p.doc) for p in ALGORITHMS[_normalize(algorithm)[0]]]


def class_patches(obj) -> dict[str, str]:
    """`Class.name` -> what it changes, for every applied patch on the class of `obj` or one of its bases."""
    docs = {p.seam: p.doc for patches in ALGORITHMS.values() for p in patches}
    mro = type(obj).__mro__
    return {
        f"{rec.owner_obj.__name__}.{rec.name}": docs.get(seam, "")
        for seam, rec in sorted(_STATE.applied.items())
        if rec.owner_obj in mro
    }


def _module_of(owner: str) -> str:
    """The module part of a patch owner's dotted path: up to its first CamelCase part (a class)."""
    parts = owner.split(".")
    cut = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    return ".".join(parts[:cut])


def trl_modules(algorithm: str) -> frozenset[str]:
    """The TRL modules `algorithm`'s patches live in (the top-level `trl`, where aliases go, left out)."""
    return frozenset(_module_of(p.owner) for p in ALGORITHMS[algorithm]) - {"trl"}


def trl_aliases() -> dict[str, str]:
    """ "trl.<Name>" -> the algorithm whose patches add that name to `trl` (ORPO's, CPO's, PPO's classes)."""
    return {f"trl.{p.name}": a for a, patches in ALGORITHMS.items() for p in patches if p.owner == "trl"}


def apply_on_import(algorithm: str) -> None:
    """Patch `algorithm` as the import hook asks (on_import.py): `PatchFastRL`'s checks and records."""
    _patch([algorithm])


def import_rules() -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """What the import hook watches: each algorithm's TRL modules, and the `trl` names aliases add."""
    return {a: trl_modules(a) for a in ALGORITHMS}, trl_aliases()
