"""What a patch is, and how a TRL seam is checked before anything is assigned.

A `Patch` is one explicit attribute assignment on a TRL module or class, `owner.name = make(original)`: a method
override, or a module-level symbol such as `trl.trainer.grpo_trainer.add_fused_lm_head`. TRL's source is never read,
edited or exec'd. `check_seam` verifies, before the registry assigns anything, that the owner and the attribute exist
and that every callable slimrl relies on still has the parameters it expects; a moved seam or a TRL outside the
supported range raises `PatchError`, naming the seam and the installed TRL version.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MISSING = object()


class PatchError(RuntimeError):
    """A TRL seam slimrl patches is missing or has changed shape, or the installed TRL is not supported."""


@dataclass(frozen=True)
class Patch:
    """One override: `owner.name = make(original)`.

    owner: dotted path of a module or class inside TRL ("trl.trainer.grpo_trainer.GRPOTrainer").
    params: the leading parameter names the original must have; None skips the check.
    make: builds the replacement from the original object.
    doc: what the override changes (one line, listed by `slimrl.patches.registry.describe`).
    creates: the symbol is added where TRL has none (e.g. a top-level alias `trl.ORPOTrainer`): only the owner is
        checked, `make` gets None, and unpatch deletes the symbol again. Where TRL already defines the name, the
        patch is skipped and TRL's own object is left alone.
    uses: (attribute, leading params) of the original that the replacement relies on without replacing them (e.g.
        methods a subclass of the original overrides or calls); checked like `params`.
    requires: (module, name, leading params or None) of other TRL objects the replacement reads, private helpers
        included; each must exist (and have those parameters).
    """

    owner: str
    name: str
    params: tuple[str, ...] | None
    make: Callable[[Any], Any]
    doc: str = ""
    creates: bool = False
    uses: tuple[tuple[str, tuple[str, ...]], ...] = ()
    requires: tuple[tuple[str, str, tuple[str, ...] | None], ...] = ()

    @property
    def seam(self) -> str:
        return f"{self.owner}.{self.name}"


def trl_version() -> str:
    import trl

    return trl.__version__


def check_trl_version() -> None:
    """The TRL in memory (its `__version__`) against slimrl/versions.py's range."""
    from packaging.specifiers import SpecifierSet

    from ..versions import SUPPORTED

    version, spec = trl_version(), SUPPORTED["trl"]
    if version not in SpecifierSet(spec, prereleases=True):
        raise PatchError(
            f"slimrl supports TRL {spec}, but TRL {version} is installed. Install a supported version: "
            f"pip install 'trl{spec}'."
        )


def resolve(dotted: str) -> Any:
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


def own_attr(owner_obj: Any, name: str) -> Any:
    """The attribute as stored on the owner itself (not inherited), or MISSING."""
    if inspect.isclass(owner_obj):
        return owner_obj.__dict__.get(name, MISSING)
    return vars(owner_obj).get(name, MISSING)


def unwrap_descriptor(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def _check_params(label: str, obj: Any, params: tuple[str, ...]) -> None:
    try:
        names = tuple(inspect.signature(obj).parameters)
    except (TypeError, ValueError) as exc:
        raise PatchError(f"slimrl cannot read the signature of {label}: {exc}") from exc
    if names[: len(params)] != params:
        raise PatchError(
            f"slimrl cannot patch {label}: expected parameters starting with {params}, found {names}. "
            "This TRL version moved the seam; pin a supported TRL or upgrade slimrl."
        )


def _check_required(where: str, requires) -> None:
    for module, name, params in requires:
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise PatchError(
                f"slimrl cannot patch {where}: it relies on `{module}.{name}`, which is gone ({exc})."
            ) from exc
        if params is not None:
            _check_params(f"{where} (it calls `{module}.{name}`)", obj, params)


def check_seam(patch: Patch) -> Any:
    """The owner object if the seam exists with the expected parameters, else raise PatchError."""
    where = f"the seam `{patch.seam}` (TRL {trl_version()})"
    try:
        owner_obj = resolve(patch.owner)
    except (ImportError, AttributeError) as exc:
        raise PatchError(f"slimrl cannot patch {where}: `{patch.owner}` does not exist ({exc}).") from exc
    _check_required(where, patch.requires)
    if patch.creates:
        return owner_obj
    current = getattr(owner_obj, patch.name, MISSING)
    if current is MISSING:
        raise PatchError(f"slimrl cannot patch {where}: `{patch.name}` is not defined on `{patch.owner}`.")
    target = getattr(unwrap_descriptor(current), "__slimrl_original__", current)
    if patch.params is not None:
        _check_params(where, target, patch.params)
    for attr, params in patch.uses:
        used = getattr(target, attr, MISSING)
        if used is MISSING:
            raise PatchError(f"slimrl cannot patch {where}: it relies on `{patch.name}.{attr}`, which is gone.")
        _check_params(f"{where} (its `{attr}`)", used, params)
    return owner_obj


def alias_patches(module: str, names: tuple[str, ...]) -> list[Patch]:
    """`trl.<name> = <module>.<name>` for each name, added only where TRL has no such symbol (Unsloth scripts write
    `from trl import ORPOTrainer`; TRL 1.16 has it only under `trl.experimental.orpo`)."""

    def maker(name):
        return lambda _missing: getattr(importlib.import_module(module), name)

    return [Patch("trl", name, None, maker(name), doc=f"alias of {module}.{name}", creates=True) for name in names]
