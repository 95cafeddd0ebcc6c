"""Overrides shared by the offline trainers (DPO, KTO, SFT, reward; reusable for ORPO/CPO): set-up, checks, metric.

These trainers learn from a fixed dataset (no rollouts), so GRPO's batch-geometry, temperature and rollout-length
checks do not apply. What the patches add, and nothing else (TRL's loss code runs unchanged):
- the fused log-prob head symbol, where the trainer module imports one (`fused_head_module`; DPO/KTO/SFT): slimrl's
  drop-in `slimrl.ops.logprob.add_fused_lm_head` scores only labelled tokens in bounded tiles. None for trainers
  without that seam (RewardTrainer: a sequence-classification model; experimental ORPO/CPO: full logits).
- config `__init__` (rl_common's): `slimrl_num_chunks` (alias `unsloth_num_chunks`); -1 = auto, N >= 1 = N chunks.
- config `__post_init__`: precision flags resolved where TRL's default cannot run (precision.py), then the
  learning-rate check, before TRL's own checks.
- trainer `__init__`, before TRL builds anything: precision vs the model's weights; the config's `max_length` vs the
  model's `max_seq_length` (set by FastLanguageModel): a `max_length` the user set that exceeds it raises naming both
  fields, TRL's untouched default is lowered to it (logged); the model's checkpointing mode vs the config's
  `gradient_checkpointing` (rl_common's rule: the model's mode wins, a contradicting user flag is warned about); and
  TRL's `activation_offloading=True` together with the model's "offload" mode: both move saved activations to host
  memory, and TRL's hook (outer) already moves the checkpointed layer inputs that slimrl's (inner) would take over,
  so the model keeps plain checkpointing (mode True) and a warning names both fields. The chunking knob is set on
  the policy and any given reference model before TRL's `__init__` too, because `precompute_ref_log_probs=True`
  runs the reference pass inside it. After TRL's `__init__`: the knob on the policy and on the reference model TRL
  ended up with, and the model's checkpointing mode ("offload" = the activation-offload path) re-applied.
- `training_step`: the step's peak memory (CUDA max allocated, or peak RSS on CPU) as the `peak_memory_gb` metric, in
  the trainer's own metric store (`_metrics`, or `_stored_metrics` for the older ORPO/CPO trainers).
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings

from ..memory import gib, peak_memory_bytes, reset_peak_memory
from . import precision, validation
from .rl_common import (
    AUTO_CHUNKS,
    _apply_checkpointing,
    _is_model,
    _reconcile_checkpointing,
    config_post_init_maker,
    fused_head_symbol,
    make_config_init,
)

logger = logging.getLogger("slimrl")

FUSED_HEAD_PARAMS = ("model", "temperature", "cast_lm_head_to_fp32", "outputs")


def check_config(args) -> None:
    validation.check_learning_rate(args.learning_rate)


make_config_post_init = config_post_init_maker(check_config)


def check_max_length(model, args) -> None:
    """The config's `max_length` must fit the model's `max_seq_length` (FastLanguageModel) when both are set."""
    max_seq = getattr(model, "max_seq_length", None)
    max_len = getattr(args, "max_length", None)
    if not max_seq or not max_len or max_len <= max_seq:
        return
    user_fields = getattr(args, "_slimrl_user_fields", None)
    if user_fields is not None and "max_length" not in user_fields:
        # TRL's default (1024), not the user's choice: follow the model, as its max_seq_length is the explicit one
        logger.warning("slimrl: max_length=%s (TRL's default) lowered to the model's max_seq_length=%s", max_len, max_seq)
        args.max_length = max_seq
        return
    raise ValueError(
        f"max_length={max_len} in the config exceeds the model's max_seq_length={max_seq} (given to "
        f"FastLanguageModel.from_pretrained). Set max_length <= {max_seq} in the config, or load the model with "
        f"max_seq_length >= {max_len}."
    )


def reconcile_offloading(model, args) -> None:
    """TRL's `activation_offloading=True` and the model's "offload" checkpointing: keep TRL's, checkpoint plainly."""
    from ..models.checkpointing import apply_checkpointing, checkpointing_mode

    if not getattr(args, "activation_offloading", False) or checkpointing_mode(model) != "offload":
        return
    warnings.warn(
        "activation_offloading=True in the config and use_gradient_checkpointing='offload' on the model both move "
        "saved activations to host memory. TRL's activation offloading already moves the checkpointed layer inputs, "
        "so the model is set to use_gradient_checkpointing=True (recompute only) for this trainer. Set "
        "activation_offloading=False to use slimrl's offload instead, or use_gradient_checkpointing=True to silence "
        "this.",
        UserWarning,
        stacklevel=4,
    )
    apply_checkpointing(model, True)


def _set_chunks(models, chunks: int, unwrap=lambda m: m) -> None:
    from ..ops.logprob import set_num_chunks

    for m in models:
        if _is_model(m):
            set_num_chunks(unwrap(m), chunks)


def make_trainer_init(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind_partial(self, *args, **kwargs).arguments
        except TypeError:  # wrong call: let TRL raise its own error
            bound = {}
        model, trainer_args, ref_model = bound.get("model"), bound.get("args"), bound.get("ref_model")
        if trainer_args is not None and _is_model(model):
            precision.resolve_trainer_precision(trainer_args, model)
            check_max_length(model, trainer_args)
            reconcile_offloading(model, trainer_args)
            _reconcile_checkpointing(model, trainer_args)
            # precompute_ref_log_probs runs the reference pass inside TRL's __init__: the knob must be there already
            _set_chunks((model, ref_model), getattr(trainer_args, "slimrl_num_chunks", AUTO_CHUNKS))
        original(self, *args, **kwargs)
        chunks = getattr(self.args, "slimrl_num_chunks", AUTO_CHUNKS)
        _set_chunks((self.model, getattr(self, "ref_model", None)), chunks, self.accelerator.unwrap_model)
        output_embeddings = getattr(self.model, "get_output_embeddings", None)
        if chunks != AUTO_CHUNKS and output_embeddings is not None and output_embeddings() is None:
            warnings.warn(
                f"slimrl_num_chunks={chunks} has no effect: {type(self.model).__name__} has no LM head to chunk.",
                UserWarning,
                stacklevel=2,
            )
        _apply_checkpointing(self.model, self.args)

    return __init__


def _record_metric(trainer, name: str, value: float) -> None:
    metrics = getattr(trainer, "_metrics", None)
    if isinstance(metrics, dict) and "train" in metrics:
        metrics["train"][name].append(value)
    elif hasattr(trainer, "_stored_metrics"):  # ORPO/CPO: averaged in their `log`
        trainer._stored_metrics["train"][name].append(value)


def make_training_step(original):
    @functools.wraps(original)
    def training_step(self, *args, **kwargs):
        device = self.accelerator.device
        reset_peak_memory(device)
        output = original(self, *args, **kwargs)
        _record_metric(self, "peak_memory_gb", round(gib(peak_memory_bytes(device)), 4))
        return output

    return training_step


def preference_trainer_patches(algorithm: str, trainer_path: str, config_path: str, trainer_params: tuple[str, ...],
                               fused_head_module: str | None = None):
    """The patch list of one offline trainer.

    trainer_path / config_path: dotted paths of the trainer and config classes. trainer_params: the leading parameter
    names of the trainer's `__init__` (checked at patch time; the wrapper reads `model`, `args`, `ref_model` by name).
    fused_head_module: the trainer's module, when it imports `add_fused_lm_head` by name (None: no head patch).
    """
    from .registry import Patch

    patches = []
    if fused_head_module is not None:
        patches.append(Patch(algorithm, fused_head_module, "add_fused_lm_head", FUSED_HEAD_PARAMS, fused_head_symbol,
                             "completion-only, bounded-tile log-prob head"))
    patches += [
        Patch(algorithm, config_path, "__init__", ("self", "output_dir"), make_config_init,
              "accept slimrl_num_chunks / unsloth_num_chunks"),
        Patch(algorithm, config_path, "__post_init__", ("self",), make_config_post_init,
              "precision resolution and config checks"),
        Patch(algorithm, trainer_path, "__init__", trainer_params, make_trainer_init,
              "model checks, chunking, checkpointing mode"),
        # DPO/KTO/SFT/reward override it as (self, *args, **kwargs); ORPO/CPO inherit Trainer's
        Patch(algorithm, trainer_path, "training_step", ("self",), make_training_step, "peak memory metric"),
    ]
    return patches
