"""A*-PO: TRL 1.16's experimental A2POTrainer (`trl.experimental.a2po`), patched to never hold `[B, T, V]` logits.

Patched:
1. `A2POTrainer._get_sequence_logps` (the policy's forward with gradient in `compute_loss`, the reference's without
   in `_prepare_inputs`): the summed completion log-probs through slimrl's head (lean_logps.py), only the tokens the
   completion mask keeps being scored (stock scores the tokens after the first EOS too, then multiplies them by 0:
   the sums are the same).
2. Set-up (trainer_setup.py): `slimrl_num_chunks`, `slimrl_reward_errors` (each reward function wrapped as GRPO's,
   rewards.py), precision, checkpointing, the `peak_memory_gb` metric; checks before Stage 1: a `prompt` column,
   the dataset's longest prompt (cut to `max_prompt_length`) plus `max_completion_length` against the model's
   `max_seq_length`, the learning rate and sampling temperature.
Refused (an error naming the option): a model loaded with `fast_inference=True` (A2POTrainer generates with
transformers; the attached vLLM engine would hold its memory unused).
TRL's own: Stage 1 (V* from reference samples, the all-incorrect filter), Stage 2 generation, rewards, the
regression loss, the frozen reference copy, metrics.
"""

from __future__ import annotations

import functools

from ... import fields
from ..rollouts.rewards import check_policy
from ..scoring.lean_logps import IGNORE, completion_labels, lean_head_reason, scored_logprobs, warn_stock_path
from ..seams import Patch
from ..setup import validation
from ..setup.data_checks import dataset_check
from ..setup.trainer_setup import Family, SetupCall, setup_patches
from .online import wrap_reward_functions

TRAINER = "trl.experimental.a2po.a2po_trainer.A2POTrainer"
CONFIG = "trl.experimental.a2po.a2po_config.A2POConfig"
TRAINER_PARAMS = ("self", "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class")
STEP_PARAMS = ("self", "model", "inputs", "num_items_in_batch")


def check_config(args) -> None:
    check_policy(args.slimrl_reward_errors)
    validation.check_learning_rate(args.learning_rate)


def check_lengths(call: SetupCall) -> None:
    model, args = call.model, call.args
    if getattr(model, "vllm_engine", None) is not None:
        raise ValueError(
            "A2POTrainer: the model was loaded with fast_inference=True, but its vLLM engine only serves GRPO/RLOO "
            "rollouts; A2POTrainer generates with transformers. Load the model with fast_inference=False."
        )
    # A2PO cuts prompts to max_prompt_length, as check_max_seq_length counts them
    validation.check_max_seq_length(
        model, args, call.arguments.get("train_dataset"), call.arguments.get("processing_class")
    )


A2PO = Family(
    config_fields=fields.declared_by(("a2po",)),
    check_config=check_config,
    adapters=(wrap_reward_functions,),
    checks=(dataset_check("a2po"), check_lengths),
)


def make_sequence_logps(original):
    @functools.wraps(original)
    def _get_sequence_logps(self, model, input_ids, attention_mask, logits_to_keep):
        reason = lean_head_reason(self, model)
        if reason is not None:
            warn_stock_path("A2POTrainer._get_sequence_logps", reason)
            return original(self, model, input_ids, attention_mask, logits_to_keep)
        completion_mask = attention_mask[:, -logits_to_keep:]
        targets = input_ids[:, -logits_to_keep:].masked_fill(completion_mask == 0, IGNORE)
        start = input_ids.size(1) - 1 - logits_to_keep  # the position predicting the first completion token
        labels = completion_labels(input_ids, start, targets)
        log_probs = scored_logprobs(self, model, input_ids, attention_mask, labels)[:, start : start + logits_to_keep]
        return (log_probs * completion_mask).sum(dim=1)

    return _get_sequence_logps


PATCHES = [
    Patch(
        TRAINER,
        "_get_sequence_logps",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep"),
        make_sequence_logps,
        "completion log-probs through slimrl's head; no [B, T, V] logits",
    ),
    # A2POTrainer.train(self, *args, **kwargs): Stage 1, then transformers' train(*args, **kwargs)
    *setup_patches(A2PO, TRAINER, CONFIG, TRAINER_PARAMS, step_params=STEP_PARAMS, train_params=("self",)),
]
