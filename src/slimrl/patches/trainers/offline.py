"""The offline trainers (DPO, KTO, SFT, reward; the set-up of ORPO and CPO): their checks and patch list.

These trainers learn from a fixed dataset (no rollouts), so GRPO's batch-geometry, temperature and rollout-length
checks do not apply. Patched (beyond the shared set-up of trainer_setup.py):
1. The fused log-prob head symbol, where the trainer module imports one (DPO/KTO/SFT): slimrl's drop-in
   `slimrl.ops.logprob.add_fused_lm_head` scores only labelled tokens in bounded chunks. None for trainers without
   that seam (RewardTrainer: a sequence-classification model; experimental ORPO/CPO: their forward is patched
   instead, see concatenated_forward.py).
2. Config checks: every numeric field's range (config_ranges.py) and the learning-rate warning. DPO's, ORPO's and
   CPO's family (`SHARED_PREFIX_OFFLINE`) also declares `slimrl_shared_prefix` and its check (shared_prefix_rules.py),
   and `max_prompt_length` with its TRL 0.2x meaning (prompt_limit.py); KTO/SFT/reward refuse both like unknown
   keywords (max_prompt_length saying why).
3. Trainer `__init__`: the datasets' columns and rows (data_checks.py, row_checks.py); the config's `max_length`
   against the model's `max_seq_length` (set by FastLanguageModel): a `max_length` the user set that exceeds it
   raises naming both fields, TRL's untouched default is lowered to it
   (logged); TRL's `activation_offloading=True` together with the model's "offload" mode: both move saved activations
   to host memory and TRL's hook (outer) already moves the checkpointed layer inputs slimrl's (inner) would take
   over, so the model keeps plain checkpointing (mode True) and a warning names both fields.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

from ... import families, fields
from ...models.checkpointing import TRL_OFFLOADS, apply_checkpointing, checkpointing_mode, resolve_checkpointing
from ...swaps import adjust_default
from ..compat import OFFLINE_REMOVED, OFFLINE_RENAMED, PAIRED_REMOVED
from ..seams import Patch
from ..setup import prompt_limit, shared_prefix_rules, validation
from ..setup.data_checks import dataset_check
from ..setup.row_checks import rows_check
from ..setup.trainer_setup import Family, SetupCall, fused_head_patch, setup_patches

logger = logging.getLogger("slimrl")


def check_config(args) -> None:
    validation.check_learning_rate(args.learning_rate)


def check_max_length(call: SetupCall) -> None:
    """The config's `max_length` must fit the model's `max_seq_length` (FastLanguageModel) when both are set."""
    model, args = call.model, call.args
    max_seq = getattr(model, "max_seq_length", None)
    max_len = getattr(args, "max_length", None)
    if not max_seq or not max_len or max_len <= max_seq:
        return
    # TRL's default (1024), not the user's choice: follow the model, as its max_seq_length is the explicit one
    if adjust_default(args, "max_length", max_seq, "the model's max_seq_length"):
        logger.warning(
            "slimrl: max_length=%s (TRL's default) lowered to the model's max_seq_length=%s", max_len, max_seq
        )
        return
    raise ValueError(
        f"max_length={max_len} in the config exceeds the model's max_seq_length={max_seq} (given to "
        f"FastLanguageModel.from_pretrained). Set max_length <= {max_seq} in the config, or load the model with "
        f"max_seq_length >= {max_len}."
    )


def reconcile_offloading(call: SetupCall) -> None:
    """TRL's `activation_offloading=True` and the model's "offload" checkpointing: keep TRL's, checkpoint plainly."""
    trl_offloading = getattr(call.args, "activation_offloading", False)
    decided = resolve_checkpointing(mark=checkpointing_mode(call.model), trl_offloading=trl_offloading)
    if decided.row != TRL_OFFLOADS:
        return
    warnings.warn(
        "activation_offloading=True in the config and use_gradient_checkpointing='offload' on the model both move "
        "saved activations to host memory. TRL's activation offloading already moves the checkpointed layer inputs, "
        "so the model is set to use_gradient_checkpointing=True (recompute only) for this trainer. Set "
        "activation_offloading=False to use slimrl's offload instead, or use_gradient_checkpointing=True to silence "
        "this.",
        UserWarning,
        stacklevel=6,
    )
    apply_checkpointing(call.model, decided.mode)


OFFLINE = Family(
    renamed_fields=OFFLINE_RENAMED,
    removed_fields=OFFLINE_REMOVED,
    check_config=check_config,
    checks=(check_max_length, reconcile_offloading),
)


def check_paired_config(args) -> None:
    check_config(args)
    shared_prefix_rules.check_config(args)
    prompt_limit.check_config(args)


def check_prompt_limit(call: SetupCall) -> None:
    """max_prompt_length, also where a trainer keyword put it on the config after the config's own checks."""
    prompt_limit.check_config(call.args)
    prompt_limit.refuse_vision_dataset(call)
    prompt_limit.record_limit(call)


# The offline trainers with shared-prefix forwards (DPO, ORPO, CPO: chosen and rejected share their prompt), which
# also keep max_prompt_length's TRL 0.2x meaning (prompt_limit.py)
SHARED_PREFIX_OFFLINE = dataclasses.replace(
    OFFLINE,
    config_fields=(*fields.declared_by(families.PAIRED), prompt_limit.FIELD),
    removed_fields=PAIRED_REMOVED,
    check_config=check_paired_config,
    checks=(*OFFLINE.checks, check_prompt_limit),
)


def offline_patches(
    algorithm: str,
    trainer_path: str,
    config_path: str,
    trainer_params: tuple[str, ...],
    fused_head_module: str | None = None,
    family: Family = OFFLINE,
) -> list[Patch]:
    """The set-up patch list of one offline trainer.

    trainer_path / config_path: dotted paths of the trainer and config classes. trainer_params: the leading parameter
    names of the trainer's `__init__` (checked at patch time; the set-up reads `model`, `args`, `ref_model` by name).
    fused_head_module: the trainer's module, when it imports `add_fused_lm_head` by name (None: no head patch). The
    training step is DPO/KTO/SFT/reward's `(self, *args, **kwargs)` override, or Trainer's own for ORPO/CPO.
    family: OFFLINE, or a variant declaring more config fields (SHARED_PREFIX_OFFLINE).
    """
    head = [fused_head_patch(fused_head_module)] if fused_head_module is not None else []
    family = dataclasses.replace(family, checks=(dataset_check(algorithm), rows_check(algorithm), *family.checks))
    return [*head, *setup_patches(family, trainer_path, config_path, trainer_params)]
