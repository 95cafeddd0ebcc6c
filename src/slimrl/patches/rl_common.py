"""Overrides shared by the online RL trainers (GRPO, RLOO): each builder takes TRL's original and returns a wrapper.

What they add, and nothing else:
- config `__init__`: the extra field `slimrl_num_chunks` (alias `unsloth_num_chunks`): -1 = automatic tiling of the
  log-prob head; N >= 1 = the scored tokens are split into N chunks (more chunks, less memory, same numbers).
- config `__post_init__`: precision flags resolved where TRL's default cannot run (see precision.py) and the
  config checks of validation.py, run before TRL's own so the clearer message wins.
- trainer `__init__`: model-dependent checks before TRL builds anything heavy; afterwards the chunking knob and the
  model's checkpointing mode ("offload" included) are applied to the policy TRL ended up with.
- `_generate_single_turn`: FastLanguageModel.for_inference / for_training around every rollout (KV cache on,
  checkpointing off, left padding; the training flag stays as TRL has it, so dropout sampling matches stock), and the
  max_seq_length check on the actual prompts.
- `VLLMGeneration` (the name the trainer module calls): rollouts on the model's own vLLM engine when
  FastLanguageModel.from_pretrained(fast_inference=True) attached one (see vllm_rollouts); TRL's class otherwise.
- `training_step`: the step's peak memory (CUDA max allocated, or peak RSS on CPU) as the `peak_memory_gb` metric.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings

from ..memory import gib, peak_memory_bytes, reset_peak_memory
from . import precision, shared_prefix, validation
from .vllm_rollouts import VLLM_GENERATION_USES, engine_rollouts, make_vllm_generation

logger = logging.getLogger("slimrl")

AUTO_CHUNKS = -1


def _num_chunks(slimrl_num_chunks, unsloth_num_chunks) -> int:
    if slimrl_num_chunks is not None and unsloth_num_chunks is not None and slimrl_num_chunks != unsloth_num_chunks:
        raise ValueError(
            f"slimrl_num_chunks={slimrl_num_chunks} and its alias unsloth_num_chunks={unsloth_num_chunks} disagree: "
            "set one of them."
        )
    value = slimrl_num_chunks if slimrl_num_chunks is not None else unsloth_num_chunks
    value = AUTO_CHUNKS if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or not (value == AUTO_CHUNKS or value >= 1):
        raise ValueError(f"slimrl_num_chunks must be -1 (automatic) or an integer >= 1, got {value!r}.")
    return value


def make_config_init(original):
    @functools.wraps(original)
    def __init__(self, *args, slimrl_num_chunks=None, unsloth_num_chunks=None, vllm_sampling_params=None,
                 slimrl_shared_prefix=shared_prefix.AUTO, **kwargs):
        # Set before the dataclass __init__ so __post_init__ (and TRL's checks) can see them
        self.slimrl_num_chunks = _num_chunks(slimrl_num_chunks, unsloth_num_chunks)
        self.slimrl_shared_prefix = shared_prefix.validate_shared_prefix(slimrl_shared_prefix)
        self.vllm_sampling_params = vllm_sampling_params  # rollouts on the model's vLLM engine (vllm_rollouts.py)
        self._slimrl_user_fields = frozenset(kwargs)
        original(self, *args, **kwargs)

    return __init__


def config_post_init_maker(check_config):
    """A `make` for a config's `__post_init__` patch: default knob, precision, then `check_config`, then TRL's own."""

    def make_config_post_init(original):
        @functools.wraps(original)
        def __post_init__(self):
            if not hasattr(self, "slimrl_num_chunks"):  # built through dataclasses.replace or a parser
                self.slimrl_num_chunks = AUTO_CHUNKS
            precision.resolve_config_precision(self)
            check_config(self)
            original(self)

        return __post_init__

    return make_config_post_init


make_config_post_init = config_post_init_maker(validation.check_config)  # GRPO/RLOO: the rollout checks too


def _is_model(obj) -> bool:
    return hasattr(obj, "parameters") and hasattr(obj, "config")


def _reconcile_checkpointing(model, args) -> None:
    """The model's checkpointing mode (FastLanguageModel.get_peft_model) is the more specific choice and wins over the
    config's flag; a contradicting flag the user set is warned about, TRL's untouched default is just aligned."""
    mode = getattr(model, "_slimrl_checkpointing", None)
    if mode is None or bool(mode) == bool(args.gradient_checkpointing):
        return
    if "gradient_checkpointing" in getattr(args, "_slimrl_user_fields", ()) or not args.gradient_checkpointing:
        warnings.warn(
            f"gradient_checkpointing={args.gradient_checkpointing} in the config is overridden by "
            f"use_gradient_checkpointing={mode!r} given to FastLanguageModel.get_peft_model; change it there.",
            UserWarning,
            stacklevel=4,
        )
    else:
        logger.info("slimrl: gradient_checkpointing=%s, as the model was prepared with it", bool(mode))
    # transformers 5 reads the new name, TRL 1.16 the deprecated alias: keep both in step
    args.gradient_checkpointing = bool(mode)
    if hasattr(args, "activation_checkpointing"):
        args.activation_checkpointing = bool(mode)


def _apply_checkpointing(model, args) -> None:
    mode = getattr(model, "_slimrl_checkpointing", None)
    if mode is not None:
        from ..models.checkpointing import apply_checkpointing

        apply_checkpointing(model, mode)


def make_trainer_init(original):
    @functools.wraps(original)
    def __init__(self, model, *args, **kwargs):
        trainer_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        checked = trainer_args is not None and _is_model(model)
        # engine_rollouts first: vllm_sampling_params may set fields the checks below read (max_completion_length)
        with engine_rollouts(model, trainer_args) if checked else contextlib.nullcontext():
            if checked:
                precision.resolve_trainer_precision(trainer_args, model)
                train_dataset = kwargs.get("train_dataset", args[2] if len(args) > 2 else None)
                processing_class = kwargs.get("processing_class", args[4] if len(args) > 4 else None)
                validation.check_max_seq_length(model, trainer_args, train_dataset, processing_class)
                _reconcile_checkpointing(model, trainer_args)
            original(self, model, *args, **kwargs)
        from ..ops.logprob import set_num_chunks  # the knob the head reads at every call

        chunks = getattr(self.args, "slimrl_num_chunks", AUTO_CHUNKS)
        for m in (self.model, getattr(self, "ref_model", None)):
            if m is not None:
                set_num_chunks(m, chunks)
        _apply_checkpointing(self.model, self.args)

    return __init__


def make_generate_single_turn(original):
    @functools.wraps(original)
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        from ..models.fast_language_model import FastLanguageModel

        model = self.accelerator.unwrap_model(self.model)
        validation.check_rollout_lengths(model, prompt_ids, self.max_completion_length)
        was_training = model.training
        FastLanguageModel.for_inference(model)
        if was_training:
            # Stock TRL samples in train mode: with dropout active, eval-mode rollouts would change the samples
            # (and the RNG stream after them). Cache on and checkpointing off change no numbers, so they stay.
            model.train()
        try:
            return original(self, prompt_ids, *args, **kwargs)
        finally:
            if was_training:
                FastLanguageModel.for_training(model)

    return _generate_single_turn


def make_training_step(original):
    @functools.wraps(original)
    def training_step(self, model, inputs, num_items_in_batch=None):
        device = self.accelerator.device
        reset_peak_memory(device)
        output = original(self, model, inputs, num_items_in_batch)
        self._metrics["train"]["peak_memory_gb"].append(round(gib(peak_memory_bytes(device)), 4))
        return output

    return training_step


def fused_head_symbol(_original):
    from ..ops.logprob import add_fused_lm_head

    return add_fused_lm_head


def rl_trainer_patches(algorithm: str, module: str, trainer: str, config_module: str, config: str):
    """The patch list shared by GRPO and RLOO (their seams have the same names and shapes)."""
    from .registry import Patch

    trainer_path, config_path = f"{module}.{trainer}", f"{config_module}.{config}"
    return [
        Patch(algorithm, module, "add_fused_lm_head", ("model", "temperature", "cast_lm_head_to_fp32", "outputs"),
              fused_head_symbol, "completion-only, bounded-tile log-prob head"),
        Patch(algorithm, config_path, "__init__", ("self", "output_dir"), make_config_init,
              "accept slimrl_num_chunks / unsloth_num_chunks"),
        Patch(algorithm, config_path, "__post_init__", ("self",), make_config_post_init,
              "precision resolution and config checks"),
        Patch(algorithm, trainer_path, "__init__", ("self", "model", "reward_funcs", "args", "train_dataset",
              "eval_dataset", "processing_class"), make_trainer_init, "model checks, chunking, checkpointing mode"),
        Patch(algorithm, trainer_path, "_generate_single_turn", ("self", "prompt_ids"), make_generate_single_turn,
              "inference/training mode around rollouts"),
        Patch(algorithm, module, "VLLMGeneration", ("model", "accelerator", "processing_class", "mode"),
              make_vllm_generation, "rollouts on the model's attached vLLM engine", uses=VLLM_GENERATION_USES),
        Patch(algorithm, trainer_path, "training_step", ("self", "model", "inputs", "num_items_in_batch"),
              make_training_step, "peak memory metric"),
        *shared_prefix.shared_prefix_patches(algorithm, module, trainer),
    ]
