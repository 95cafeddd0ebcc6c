"""`PPOTrainer`'s set-up: the one every patched TRL trainer gets (patches/setup/trainer_setup.py), with PPO's `Family`.

Choices:
1. TRL's older argument names, `config=` (TRL's PPO before `args=`) and `tokenizer=`, are taken with a notice; both
   names given with different values raise (compat.py's table, compat.take_alias's rule).
2. `PPO_SETUP` adds to the shared set-up (FastLanguageModel's tokenizer when none is given, the tokenizer check,
   precision from the weights, the model's checkpointing mode, the chunk knob on every model given, re-applied after
   `__init__`): a tokenizer is required (PPO generates and pads itself; no pad token: the eos token, said once), the
   dataset's columns (data_checks: `prompt` or `input_ids`) and the model's `max_seq_length` against the longest
   prompt plus `response_length` (online.py's check), all before any model is built.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..notices import notice
from ..patches.compat import PPO_ARGUMENT_ALIASES, take_alias
from ..patches.setup.data_checks import dataset_check
from ..patches.setup.row_checks import rows_check
from ..patches.setup.trainer_setup import SetupCall
from ..patches.trainers.online import check_sequence_lengths
from .config import PPO_CONFIG


def current_arguments(args, processing_class, config, tokenizer):
    """(args, processing_class) from TRL's names and the older ones (`config=`, `tokenizer=`)."""
    given = {
        name: value
        for name, value in (
            ("args", args),
            ("processing_class", processing_class),
            ("config", config),
            ("tokenizer", tokenizer),
        )
        if value is not None
    }
    for old, new in PPO_ARGUMENT_ALIASES:
        take_alias(given, old, new, "PPOTrainer")
    processing_class = given.get("processing_class")
    if isinstance(processing_class, nn.Module):
        raise TypeError(
            "processing_class is a model: positional arguments follow TRL's PPO order (args, "
            "processing_class, model, ref_model, reward_model, train_dataset, ...); TRL's older order "
            "(config, model, ref_model, tokenizer, ...) only works by keyword: PPOTrainer(config=..., "
            "model=..., tokenizer=...)."
        )
    return given.get("args"), processing_class


def require_tokenizer(call: SetupCall) -> None:
    """PPO pads prompts and responses itself: a tokenizer is needed, and one without a pad token pads with eos."""
    tokenizer = call.arguments.get("processing_class")
    if tokenizer is None:
        raise ValueError(
            "PPOTrainer needs processing_class= (the tokenizer; tokenizer= is accepted too), unless "
            "the model comes from FastLanguageModel.from_pretrained, which attaches its own."
        )
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        notice(f"the tokenizer has no pad token: PPOTrainer pads with its eos token {tokenizer.eos_token!r}.")
        tokenizer.pad_token = tokenizer.eos_token


PPO_SETUP = dataclasses.replace(
    PPO_CONFIG,
    adapters=(require_tokenizer,),
    checks=(dataset_check("ppo"), rows_check("ppo"), check_sequence_lengths),
)
