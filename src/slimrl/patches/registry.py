"""The one registry of slimrl's patches to TRL, and `PatchFastRL` / `unpatch`.

Rules every patch follows:
- A patch is an explicit attribute assignment on a TRL module or class (a method override, or a module-level symbol
  such as `trl.trainer.grpo_trainer.add_fused_lm_head`). TRL's source is never read, edited or exec'd.
- Before anything is assigned, every seam of the requested algorithms is checked: the attribute exists and its
  parameters start with the names we expect. A moved seam or a TRL outside the supported range raises `PatchError`
  naming the seam and the installed TRL version; nothing is half-applied.
- Patching is idempotent, reversible (`unpatch()` puts back the very objects that were there) and independent of
  import order: classes are patched in place, so `from trl import GRPOTrainer` before or after sees the patch.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("slimrl")

SUPPORTED_TRL = (">=1.16", "<2")
_MISSING = object()


class PatchError(RuntimeError):
    """A TRL seam slimrl patches is missing or has changed shape, or the installed TRL is not supported."""


@dataclass(frozen=True)
class Patch:
    """One override: `owner.name = make(original)`.

    owner: dotted path of a module or class inside TRL ("trl.trainer.grpo_trainer.GRPOTrainer").
    params: the leading parameter names the original must have (checked at patch time); None skips the check.
    make: builds the replacement from the original object.
    creates: the symbol is added where TRL has none (e.g. a top-level alias `trl.ORPOTrainer`): only the owner is
        checked, `make` gets None, and unpatch deletes the symbol again. Where TRL already defines the name, the
        patch is skipped and TRL's own object is left alone.
    uses: (attribute, leading params) of the original that the replacement relies on without replacing them (e.g.
        methods a subclass of the original overrides or calls); checked like `params`.
    """

    algorithm: str
    owner: str
    name: str
    params: tuple[str, ...] | None
    make: Callable[[Any], Any]
    doc: str = ""
    creates: bool = False
    uses: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def seam(self) -> str:
        return f"{self.owner}.{self.name}"


@dataclass
class _Applied:
    owner_obj: Any
    name: str
    original: Any  # what the owner's own __dict__ held (or _MISSING when the attribute was inherited)
    replacement: Any


@dataclass
class _State:
    applied: dict[str, _Applied] = field(default_factory=dict)  # seam -> record
    algorithms: set[str] = field(default_factory=set)


_REGISTRY: list[Patch] = []
_STATE = _State()


def register(patch: Patch) -> Patch:
    _REGISTRY.append(patch)
    return patch


def _load_all_patch_modules() -> None:
    # Each trainer's patches live in their own module and register themselves on import
    from . import cpo, dpo, grpo, kto, orpo, ppo, reward, rloo, sft  # noqa: F401


def supported_algorithms() -> list[str]:
    _load_all_patch_modules()
    return sorted({p.algorithm for p in _REGISTRY})


def patches_for(algorithm: str) -> list[Patch]:
    _load_all_patch_modules()
    return [p for p in _REGISTRY if p.algorithm == algorithm]


def _resolve(dotted: str) -> Any:
    """Import `a.b.C.D`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _trl_version() -> str:
    import trl

    return trl.__version__


def check_trl_version() -> None:
    from packaging.version import Version

    version = Version(_trl_version())
    low, high = Version(SUPPORTED_TRL[0][2:]), Version(SUPPORTED_TRL[1][1:])
    if not (low <= version < high):
        raise PatchError(
            f"slimrl supports TRL {','.join(SUPPORTED_TRL)}, but TRL {version} is installed. "
            f"Install a supported version: pip install 'trl{','.join(SUPPORTED_TRL)}'."
        )


def _own_attr(owner_obj: Any, name: str) -> Any:
    """The attribute as stored on the owner itself (not inherited), or _MISSING."""
    if inspect.isclass(owner_obj):
        return owner_obj.__dict__.get(name, _MISSING)
    return vars(owner_obj).get(name, _MISSING)


def _unwrap_descriptor(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def _check_seam(patch: Patch) -> Any:
    """Return the current attribute if the seam exists with the expected parameters, else raise PatchError."""
    where = f"the seam `{patch.seam}` (TRL {_trl_version()})"
    try:
        owner_obj = _resolve(patch.owner)
    except (ImportError, AttributeError) as exc:
        raise PatchError(f"slimrl cannot patch {where}: `{patch.owner}` does not exist ({exc}).") from exc
    current = getattr(owner_obj, patch.name, _MISSING)
    if patch.creates:
        return owner_obj
    if current is _MISSING:
        raise PatchError(f"slimrl cannot patch {where}: `{patch.name}` is not defined on `{patch.owner}`.")
    target = getattr(_unwrap_descriptor(current), "__slimrl_original__", current)
    checks = [(where, target, patch.params)] if patch.params is not None else []
    for attr, params in patch.uses:
        used = getattr(target, attr, _MISSING)
        if used is _MISSING:
            raise PatchError(f"slimrl cannot patch {where}: it relies on `{patch.name}.{attr}`, which is gone.")
        checks.append((f"{where} (its `{attr}`)", used, params))
    for label, obj, params in checks:
        try:
            names = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as exc:
            raise PatchError(f"slimrl cannot read the signature of {label}: {exc}") from exc
        if names[: len(params)] != params:
            raise PatchError(
                f"slimrl cannot patch {label}: expected parameters starting with {params}, found {names}. "
                "This TRL version moved the seam; pin a supported TRL or upgrade slimrl."
            )
    return owner_obj


def _normalize(algorithm: str | None) -> list[str]:
    supported = supported_algorithms()
    if algorithm is None:
        return supported
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a string or None, got {type(algorithm).__name__}")
    name = algorithm.strip().lower()
    if name not in supported:
        raise ValueError(f"Unknown algorithm {algorithm!r}. Supported: {', '.join(supported)} (or None for all).")
    return [name]


def PatchFastRL(algorithm: str | None = None, FastLanguageModel: Any = None) -> list[str]:  # noqa: N802, N803
    """Make TRL's trainers for `algorithm` ("grpo", "rloo", ...; case-insensitive; None = all) use slimrl's paths.

    `FastLanguageModel` is accepted for Unsloth compatibility and not needed. Returns the algorithms now patched.
    """
    algorithms = _normalize(algorithm)
    check_trl_version()
    todo = [p for a in algorithms if a not in _STATE.algorithms for p in patches_for(a)]
    # Check every seam before assigning anything, so a moved seam leaves stock TRL untouched
    owners = [_check_seam(p) for p in todo]
    for patch, owner_obj in zip(todo, owners):
        if patch.seam in _STATE.applied:  # shared between algorithms, already in place
            continue
        if patch.creates:
            if getattr(owner_obj, patch.name, _MISSING) is not _MISSING:  # TRL has it: nothing to add or remove
                continue
            replacement = patch.make(None)
            setattr(owner_obj, patch.name, replacement)
            _STATE.applied[patch.seam] = _Applied(owner_obj, patch.name, _MISSING, replacement)
            continue
        original = _own_attr(owner_obj, patch.name)
        current = getattr(owner_obj, patch.name)
        replacement = patch.make(_unwrap_descriptor(current))
        if isinstance(original, (staticmethod, classmethod)) and not isinstance(replacement, type(original)):
            replacement = type(original)(replacement)
        fn = _unwrap_descriptor(replacement)
        try:
            fn.__slimrl_original__ = _unwrap_descriptor(current)
            fn.__slimrl_seam__ = patch.seam
        except (AttributeError, TypeError):
            pass
        setattr(owner_obj, patch.name, replacement)
        _STATE.applied[patch.seam] = _Applied(owner_obj, patch.name, original, replacement)
    _STATE.algorithms.update(algorithms)
    logger.info("slimrl: patched TRL %s for %s", _trl_version(), ", ".join(sorted(_STATE.algorithms)))
    return sorted(_STATE.algorithms)


def unpatch(algorithm: str | None = None) -> None:
    """Restore stock TRL exactly (all algorithms, or one)."""
    algorithms = _normalize(algorithm) if algorithm is not None else sorted(_STATE.algorithms)
    keep = _STATE.algorithms - set(algorithms)
    still_needed = {p.seam for a in keep for p in patches_for(a)}
    for seam, rec in list(_STATE.applied.items()):
        if seam in still_needed or not any(p.seam == seam for a in algorithms for p in patches_for(a)):
            continue
        if rec.original is _MISSING:
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
