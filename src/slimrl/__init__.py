"""slimrl: memory-lean RL fine-tuning on top of Hugging Face TRL's own trainers.

    from slimrl import FastLanguageModel
    from trl import GRPOConfig, GRPOTrainer   # patched: slimrl's paths

`from slimrl import FastLanguageModel` patches TRL's trainers as they are imported, before or after it, as Unsloth
does (slimrl.patches.on_import.patch_on_import; `SLIMRL_NO_AUTO_PATCH=1` turns it off, `PatchFastRL("grpo")` then
patches explicitly). Importing slimrl itself imports neither TRL nor vLLM.
"""

from __future__ import annotations

from .swaps import ProcessValue as _ProcessValue  # no TRL, no torch

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
    "longest_completion",
    "describe",
    "config_rules",
    "base_as_teacher",
    "apply_checkpointing",
    "checkpointing_mode",
    "configure_offload",
    "restore_lora",
    "embedded_model_path",
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
# the other public names -> the module that owns each (imported on first use)
_HOMES = {
    "describe": ".description",
    "config_rules": ".patches.setup.config_ranges",  # the range of every numeric config field slimrl checks (no TRL)
    "SafeInterrupt": ".training.interrupt",
    "plan": ".planning",
    "longest_completion": ".planning.longest",  # the longest completion whose planned step fits (slimrl plan --longest)
    "base_as_teacher": ".models.teacher",  # a LoRA student's base, adapter disabled, as its distillation teacher
    "apply_checkpointing": ".models.checkpointing",  # a model's checkpointing mode, changed after loading
    "checkpointing_mode": ".models.checkpointing",
    "configure_offload": ".models.checkpointing",  # the activation offloader's settings
    "restore_lora": ".models.lora_speed",  # PEFT's own LoRA forward again (fused_lora, skip_lora_input_casts off)
    "embedded_model_path": ".models.embedded",  # the embedded model's safetensors folder (converted on first use)
}


_VERSIONS_CHECKED = _ProcessValue("versions_checked", False, "the library versions checked at the API's first use")


def _check_versions_once() -> None:
    """At the API's first use: the library versions, then bitsandbytes imported without its start-up line."""
    if not _VERSIONS_CHECKED.get():
        from .noise import import_bitsandbytes_quietly
        from .versions import check

        check()  # raises ImportError naming any library outside slimrl's supported ranges (slimrl/versions.py)
        import_bitsandbytes_quietly()  # before peft imports it (slimrl/noise.py)
        _VERSIONS_CHECKED.set(True)


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
    if name in ("FastLanguageModel", *_UNSLOTH_MODEL_NAMES):
        from .patches.on_import import patch_on_import

        patch_on_import()  # as Unsloth's import does: TRL's trainers patched as the script imports them
    if name == "FastLanguageModel":
        from .fast_language_model import FastLanguageModel

        return FastLanguageModel
    if name in ("PPOConfig", "PPOTrainer"):  # slimrl's own PPO (TRL 1.16 has none); imports TRL only when used
        from . import ppo

        return getattr(ppo, name)
    if name in ("PatchFastRL", "unpatch", "is_patched", "PatchError"):
        from .patches import registry

        return getattr(registry, name)
    if name in _UNSLOTH_MODEL_NAMES:
        from . import fast_model

        return getattr(fast_model, name)
    if name in _UNSLOTH_SHORTCUTS:
        from . import unsloth_api

        return getattr(unsloth_api, name)
    if name in _SANDBOX_NAMES:  # no TRL, no torch: model-written code runs in a separate process
        from . import sandbox

        return getattr(sandbox, name)
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module 'slimrl' has no attribute {name!r}")
