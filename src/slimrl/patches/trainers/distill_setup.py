"""The set-up TRL's distillation trainers share (GKD, GOLD, DistillationTrainer): the families their trainer set-up
runs with (trainer_setup.py) and the checks made before TRL's `__init__`.

1. GKD and GOLD are SFTTrainer subclasses whose configs are SFTConfigs: the offline family (offline.py: `max_length`
   against the model's `max_seq_length`, TRL's `activation_offloading` against slimrl's offload mode), their
   datasets checked like SFT's chat data. DistillationTrainer generates from prompts (its own family: the learning
   rate checked, its dataset needs `prompt`).
2. The teacher: the student model itself is refused (the divergence would be 0 whatever the data; to distil from the
   student's base with its adapter disabled, `slimrl.base_as_teacher(model)` shares the base instead), and so is a
   `base_as_teacher` under DeepSpeed or FSDP (they would prepare the shared weights as a second model); a teacher
   sharing no vocabulary size with the student is left to TRL's own check.
3. Options slimrl's lean loss does not compute are refused, naming the option: GOLD's `use_uld_loss=True` (the
   cross-tokenizer ULD loss aligns the two full distributions; run it on stock TRL: `slimrl.unpatch("gold")`), at
   `GOLDConfig(...)` and again when the trainer is built (a config made before `PatchFastRL` skipped the first).
"""

from __future__ import annotations

import dataclasses

from ..setup import validation
from ..setup.data_checks import dataset_check
from ..setup.trainer_setup import Family, SetupCall
from .offline import OFFLINE


def _same_model(a, b) -> bool:
    if a is b:
        return True
    unwrap = [m.get_base_model() if hasattr(m, "get_base_model") else m for m in (a, b)]
    return unwrap[0] is unwrap[1]


def check_teacher(call: SetupCall) -> None:
    from ...models.teacher import BaseTeacher

    teacher = call.arguments.get("teacher_model")
    if teacher is None or isinstance(teacher, str):
        return
    sharded = [name for name in ("deepspeed", "fsdp") if getattr(call.args, name, None)]
    if isinstance(teacher, BaseTeacher) and sharded:
        raise ValueError(
            f"teacher_model=slimrl.base_as_teacher(model) with {sharded[0]}: the teacher shares the student's "
            f"weights, which {sharded[0]} would prepare as a second model. Pass a separate teacher model."
        )
    if _same_model(teacher, call.model):
        raise ValueError(
            f"{type(call.arguments['self']).__name__}: teacher_model is the model being trained, so the divergence "
            "is 0 whatever the data. To distil from its base with the adapter disabled (one base in memory), pass "
            "teacher_model=slimrl.base_as_teacher(model); otherwise pass a separate teacher model."
        )


def refuse_uld(args) -> None:
    if getattr(args, "use_uld_loss", False):
        raise ValueError(
            "GOLDConfig(use_uld_loss=True): slimrl's lean distillation loss computes the generalized JSD on a shared "
            "vocabulary; the cross-tokenizer ULD loss is not covered. Run it on stock TRL: slimrl.unpatch('gold') "
            "before building the trainer (or PatchFastRL only the algorithms you use)."
        )


def _gold_config_check(args) -> None:
    OFFLINE.check_config(args)
    refuse_uld(args)


def _gold_trainer_check(call: SetupCall) -> None:
    refuse_uld(call.args)  # a config built before PatchFastRL skipped the config-time check


SFT_DISTILL = dataclasses.replace(OFFLINE, checks=(*OFFLINE.checks, check_teacher))
GOLD_DISTILL = dataclasses.replace(
    SFT_DISTILL, check_config=_gold_config_check, checks=(*SFT_DISTILL.checks, _gold_trainer_check)
)
DISTILLATION = Family(
    check_config=lambda args: validation.check_learning_rate(args.learning_rate),
    checks=(dataset_check("distillation"), check_teacher),
)
