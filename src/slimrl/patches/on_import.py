"""`patch_on_import()`: TRL's trainers patched as a script imports them, as Unsloth does when it is imported.

Called on `from slimrl import FastLanguageModel` (and by any other entry point that stands for Unsloth's import).
Cheap: it installs auto.py's hook and imports neither TRL nor slimrl's registry; the registry is imported when the
script first uses TRL (then its cost is paid beside TRL's own).
"""

from __future__ import annotations

import os

from . import auto

AUTO_PATCH_OFF = "SLIMRL_NO_AUTO_PATCH"  # set to anything but "" or "0": no patching on import


def _rules():
    from .registry import import_rules

    return import_rules()


def _apply(algorithm: str) -> None:
    from .registry import apply_on_import

    apply_on_import(algorithm)


def patch_on_import() -> bool:
    """Patch what the script imported from TRL already, and each other algorithm when one of its TRL modules is
    imported, through the checks `PatchFastRL` runs. Once per process (after `unpatch()`, only `PatchFastRL` patches);
    `SLIMRL_NO_AUTO_PATCH=1` turns it off. Returns whether patching on import is on."""
    if os.environ.get(AUTO_PATCH_OFF, "").strip() not in ("", "0"):
        return False
    return auto.install_once(lambda: auto.ImportHook("trl", _rules, _apply))
