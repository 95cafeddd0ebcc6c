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
    "__version__",
]


_checked = False


def _check_versions_once() -> None:
    """At the API's first use: the library versions, then bitsandbytes imported without its start-up line."""
    global _checked
    if not _checked:
        from .noise import import_bitsandbytes_quietly
        from .versions import check

        check()  # raises ImportError naming any library outside slimrl's supported ranges (slimrl/versions.py)
        import_bitsandbytes_quietly()  # before peft imports it (slimrl/noise.py)
        _checked = True


def __getattr__(name):
    # Lazy: `import slimrl` stays cheap and never imports trl before the user's script does
    if name in ("FastLanguageModel", "PatchFastRL", "PPOConfig", "PPOTrainer"):
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
    if name == "SafeInterrupt":
        from .training.interrupt import SafeInterrupt

        return SafeInterrupt
    if name == "plan":
        from .planning import plan

        return plan
    raise AttributeError(f"module 'slimrl' has no attribute {name!r}")
