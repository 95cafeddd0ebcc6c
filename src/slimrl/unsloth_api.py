"""Unsloth names that are shortcuts over slimrl's own: PatchDPOTrainer, PatchKTOTrainer, is_bfloat16_supported.

(FastModel and FastVisionModel are in slimrl.fast_model; the reward helpers that run model-written code in
slimrl.sandbox.)
"""

from __future__ import annotations


def PatchDPOTrainer() -> list[str]:  # noqa: N802 (Unsloth's name)
    """Unsloth's call before building a DPOTrainer or an ORPOTrainer (its notebooks use it for both): patches TRL's
    DPO and ORPO trainers, as PatchFastRL("dpo") and PatchFastRL("orpo"). Returns the algorithms now patched."""
    from .patches.registry import PatchFastRL

    PatchFastRL("dpo")
    return PatchFastRL("orpo")


def PatchKTOTrainer() -> list[str]:  # noqa: N802 (Unsloth's name)
    """Unsloth's call before building a KTOTrainer: PatchFastRL("kto"). Returns the algorithms now patched."""
    from .patches.registry import PatchFastRL

    return PatchFastRL("kto")


def is_bfloat16_supported() -> bool:
    """True where a config's `bf16=True` trains in bfloat16 without further settings: a CUDA GPU with bfloat16.

    False on a CPU: there `bf16=True` needs `use_cpu=True` as well (slimrl.patches.setup.precision, the one owner of
    this
    test); leave bf16/fp16 unset and slimrl picks the precision from the model.
    """
    from .patches.setup.precision import cuda_bf16_supported

    return cuda_bf16_supported()
