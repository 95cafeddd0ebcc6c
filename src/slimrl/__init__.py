"""slimrl: memory-lean RL fine-tuning on top of Hugging Face TRL's own trainers.

    from slimrl import FastLanguageModel, PatchFastRL
    PatchFastRL("grpo", FastLanguageModel)

Importing slimrl does not import TRL: PatchFastRL imports it when it patches, so the order in which a script imports
`trl` and `slimrl` does not matter.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "FastLanguageModel",
    "PatchFastRL",
    "unpatch",
    "is_patched",
    "PatchError",
    "PPOConfig",
    "PPOTrainer",
    "SafeInterrupt",
    "plan",
    "base_as_teacher",
    "__version__",
    # the other names Unsloth's notebooks import (docs/unsloth-names.md)
    "FastModel",
    "FastVisionModel",
    "PatchDPOTrainer",
    "PatchKTOTrainer",
    "is_bfloat16_supported",
    "check_python_modules",
    "create_locked_down_function",
    "execute_with_time_limit",
]
_UNSLOTH_MODEL_NAMES = ("FastModel", "FastVisionModel")
_UNSLOTH_SHORTCUTS = ("PatchDPOTrainer", "PatchKTOTrainer", "is_bfloat16_supported")
_SANDBOX_NAMES = ("check_python_modules", "create_locked_down_function", "execute_with_time_limit")


_checked = False


def _check_versions_once() -> None:
    global _checked
    if not _checked:
        from .versions import check

        check()  # raises ImportError naming any library outside slimrl's supported ranges (slimrl/versions.py)
        _checked = True


def __getattr__(name):
    # Lazy: `import slimrl` stays cheap and never imports trl before the user's script does
    if name in (
        "FastLanguageModel",
        "PatchFastRL",
        "PPOConfig",
        "PPOTrainer",
        *_UNSLOTH_MODEL_NAMES,
        *_UNSLOTH_SHORTCUTS,
    ):
        _check_versions_once()
    if name == "FastLanguageModel":
        from .models.fast_language_model import FastLanguageModel

        return FastLanguageModel
    if name in ("PPOConfig", "PPOTrainer"):  # slimrl's own PPO (TRL 1.16 has none); imports TRL only when used
        from . import ppo

        return getattr(ppo, name)
    if name in ("PatchFastRL", "unpatch", "is_patched", "PatchError"):
        from .patches import registry

        return getattr(registry, name)
    if name in _UNSLOTH_MODEL_NAMES:
        from .models import fast_model

        return getattr(fast_model, name)
    if name in _UNSLOTH_SHORTCUTS:
        from . import unsloth_api

        return getattr(unsloth_api, name)
    if name in _SANDBOX_NAMES:  # no TRL, no torch: model-written code runs in a separate process
        from . import sandbox

        return getattr(sandbox, name)
    if name == "SafeInterrupt":
        from .training.interrupt import SafeInterrupt

        return SafeInterrupt
    if name == "plan":
        from .planning import plan

        return plan
    if name == "base_as_teacher":  # a LoRA student's base, adapter disabled, as its distillation teacher
        from .models.teacher import base_as_teacher

        return base_as_teacher
    raise AttributeError(f"module 'slimrl' has no attribute {name!r}")
