"""Patching TRL's trainers as a script imports them, as Unsloth does on import (on_import.patch_on_import installs it).

`ImportHook` is a `sys.meta_path` finder that lets the other finders find every module of the package (`trl`) and
wraps the loader they return, so it hears when a module's code has run. When the outermost TRL import of the
thread completes (every TRL module then in `sys.modules` is whole), each algorithm with one of its modules loaded
gets its remaining modules imported and is patched through the registry's own `apply` (checked, recorded,
reversible). Cost is paid only for the trainers a script imports: the GRPO patches when `trl.trainer.grpo_config` or
`grpo_trainer` loads, nothing for `import trl` alone.

Names TRL does not define (`from trl import ORPOConfig`, `PPOTrainer`): Python's `from package import name` looks for
a submodule `package.name` when the attribute is missing; the hook answers that lookup by patching the algorithm that
adds the alias, then reports no such module, and the `from ... import` reads the alias.

The wrapped loader is put back on the module (`__loader__`, `__spec__.loader`) once its code has run. A patch that
fails (a moved seam) raises from the import that triggered it, and the algorithm stays pending: it fails again on the
next try rather than leaving stock TRL in place silently.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from collections.abc import Callable

from ..swaps import ProcessValue


class _NotifyingLoader(importlib.abc.Loader):
    """The loader another finder returned, telling the hook when the module's code has run."""

    def __init__(self, loader, hook: ImportHook):
        self._loader, self._hook = loader, hook

    def __getattr__(self, name):  # get_source, get_code, is_package, ...: the wrapped loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._hook.enter()
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None and module.__spec__.loader is self:
                module.__spec__.loader = self._loader
            outermost = self._hook.leave()
        if outermost:
            self._hook.settle()


class ImportHook(importlib.abc.MetaPathFinder):
    """Patch each algorithm once one of its modules has been imported.

    package: the top-level package watched ("trl").
    rules: returns (algorithm -> the modules its patches live in, "trl.<Name>" -> the algorithm that adds that
        alias); called once, when the package is first in use (it may import the registry, which is not cheap).
    apply: patches one algorithm (the registry's; raises PatchError on a moved seam).
    """

    def __init__(self, package: str, rules: Callable[[], tuple[dict, dict]], apply: Callable[[str], None]):
        self.package, self._rules, self.apply = package, rules, apply
        self._modules: dict[str, frozenset[str]] | None = None
        self._aliases: dict[str, str] = {}
        self._forgotten: set[str] = set()
        self.pending: set[str] = set()
        self._depth = threading.local()
        self._lock = threading.RLock()
        self._settling = False
        self._active = True

    def _load_rules(self) -> None:
        if self._modules is None:
            modules, aliases = self._rules()
            self._modules, self._aliases = modules, aliases
            if self._active:
                self.pending = (set(modules) | set(aliases.values())) - self._forgotten

    @property
    def modules(self) -> dict[str, frozenset[str]]:
        self._load_rules()
        return self._modules

    # -- installation ------------------------------------------------------------------------------------------
    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        if any(name == self.package or name.startswith(self.package + ".") for name in sys.modules):
            self.settle()  # what the script imported before

    def uninstall(self) -> None:
        self._active = False
        self.pending.clear()
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def forget(self, algorithms) -> None:
        """`algorithms` are no longer patched when their modules load (unpatch of one algorithm)."""
        self._forgotten.update(algorithms)
        self.pending.difference_update(algorithms)

    # -- the finder ---------------------------------------------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        if not self._active or (fullname != self.package and not fullname.startswith(self.package + ".")):
            return None
        if self._may_be_alias(fullname):
            self._load_rules()
            if fullname in self._aliases:
                self.settle(requested=self._aliases[fullname])
                return None  # no such module: `from trl import Name` then reads the alias just added
        spec = self._spec_from_other_finders(fullname, path, target)
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _NotifyingLoader):
            spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def _may_be_alias(self, fullname: str) -> bool:
        """`trl.ClassName`: a name looked up as a submodule by `from trl import ClassName` (modules are lowercase)."""
        parent, _, name = fullname.rpartition(".")
        return parent == self.package and name[:1].isupper()

    def _spec_from_other_finders(self, fullname, path, target):
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    # -- nesting of the package's imports, per thread -------------------------------------------------------------
    def enter(self) -> None:
        self._depth.value = getattr(self._depth, "value", 0) + 1

    def leave(self) -> bool:
        """True when the outermost import of the package in this thread has just finished."""
        self._depth.value -= 1
        return self._depth.value == 0

    # -- patching -----------------------------------------------------------------------------------------------
    def settle(self, requested: str | None = None) -> None:
        """Patch `requested` and every pending algorithm one of whose modules is loaded.

        Never blocks: the imports it runs re-enter here and return at once, and while another thread settles, this
        one returns (that thread checks again before it lets go). Blocking could deadlock on the import locks.
        """
        while self._active and self._lock.acquire(blocking=False):
            try:
                if self._settling:  # re-entered from an import this settle runs
                    if requested is not None:
                        self._patch(requested)
                    return
                self._settling = True
                try:
                    if requested is not None:
                        self._patch(requested)
                        requested = None
                    self._load_rules()
                    while ready := [a for a in sorted(self.pending) if self._loaded(a)]:
                        for algorithm in ready:
                            for name in sorted(self.modules[algorithm]):
                                if name not in sys.modules:
                                    importlib.import_module(name)
                            self._patch(algorithm)
                finally:
                    self._settling = False
            finally:
                self._lock.release()
            if not any(self._loaded(a) for a in self.pending):  # nothing another thread loaded meanwhile
                return

    def _loaded(self, algorithm: str) -> bool:
        return any(name in sys.modules for name in (self._modules or {}).get(algorithm, ()))

    def _patch(self, algorithm: str) -> None:
        self._load_rules()
        if algorithm not in self.pending:
            return
        self.pending.discard(algorithm)
        try:
            self.apply(algorithm)
        except BaseException:
            self.pending.add(algorithm)  # fail again on the next import, never fall back to stock silently
            raise


# -- the hook patch_on_import installed (one per process) ----------------------------------------------------------
NOT_REQUESTED = "not requested"  # HOOK's value until install_once or uninstall is first called; then the hook or None
HOOK = ProcessValue("import_hook", NOT_REQUESTED, "TRL's trainers patched as a script imports them (on_import.py)")


def install_once(make: Callable[[], ImportHook]) -> bool:
    """Install the hook `make` builds, the first time only (after `uninstall`, never again); True while installed."""
    if HOOK.get() is NOT_REQUESTED:
        HOOK.set(None)
        hook = make()
        HOOK.set(hook)
        hook.install()
    return HOOK.get() is not None


def uninstall() -> None:
    """No patching on import for the rest of the process (unpatch() of everything)."""
    hook = HOOK.get()
    HOOK.set(None)
    if hook not in (None, NOT_REQUESTED):
        hook.uninstall()


def forget(algorithms) -> None:
    hook = HOOK.get()
    if hook not in (None, NOT_REQUESTED):
        hook.forget(algorithms)
