"""One lean `concatenated_forward` for TRL's paired-preference trainers (experimental ORPO and CPO), which never holds
`[2B, T, V]` logits; each trainer only declares how it differs (`PairedForward`).

The shape follows Liger-Kernel's chunked losses: slimrl.ops.chunked_preference owns the chunk loop (the model runs as
stock calls it, its lm_head swapped for chunked statistics of the last hidden states); a trainer's declaration says
which statistics its loss reads. The result is stock's tuple `(chosen_logps, rejected_logps, chosen_logits,
rejected_logits, chosen_nll_loss[, aux_loss])` with the same values and dtypes, except that the two logits slots hold
0-dim tensors equal to stock's `logits.mean()`: stock's `get_batch_loss_metrics` only ever reads those slots as
`.detach().mean()`, and the mean of a 0-dim tensor is itself, so TRL's loss and metric code runs unchanged (a
broadcast view of the right shape would also fit, but its `.mean()` would walk B*T*V elements and round differently).

Encoder-decoder models, and models whose output embedding is not a plain `nn.Linear` (LoRA on lm_head,
`modules_to_save`, quantized heads), fall back to stock's full-logits forward with a warning naming the reason: the
patch applies class-wide, so raising would break a trainer that stock TRL runs fine; the numbers stay stock's.

Shared prefixes (`slimrl_shared_prefix`, shared_prefix.py `paired_layout`): the rows of a pair share their prompt, so
the model runs each distinct prompt once, every column of the rows forwarded (the mean-logits metric reads padding
positions too), and the lean head reads the hidden states back in the rows' layout: the statistics are unchanged.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...ops.chunked_preference import lean_head_or_reason, lean_policy_forward
from .shared_prefix import paired_layout, record_fallback

FORWARD_PARAMS = ("self", "model", "batch")
TRAINER_PARAMS = ("self", "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class")


@dataclass(frozen=True)
class PairedForward:
    """How one paired-preference trainer's `concatenated_forward` derives its outputs (read from the trainer as
    stock reads it)."""

    name: str  # the trainer class, for messages
    padding_value: Callable[[Any], int]  # what stock passes to `concatenated_inputs`
    average_log_prob: Callable[[Any], bool]  # sequence log-probs averaged over labelled tokens (else summed)
    nll_labels: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]  # (trainer, ids,
    # attention mask, labels) -> the chosen NLL's targets; None: no NLL is computed
    logits_drop_last: bool  # the mean-logits metric leaves out the last position (stock slices `logits[:, :-1]`)


def lean_head(trainer, model, name: str):
    """`(lm_head, causal_lm)` when the lean forward applies to this trainer/model, else warn and `(None, reason)`."""
    if trainer.is_encoder_decoder:
        reason = "the model is an encoder-decoder"
    else:
        lm_head, found = lean_head_or_reason(model, trainer.accelerator.unwrap_model)
        if lm_head is not None:
            return lm_head, found
        reason = found
    warnings.warn(
        f"slimrl: {name}.concatenated_forward runs stock TRL's full-logits path because {reason}; "
        "memory and numbers are stock's.",
        UserWarning,
        stacklevel=3,
    )
    return None, reason


def check_label_shape(labels: torch.Tensor, input_ids: torch.Tensor) -> None:
    # Stock's get_batch_logps raises this when logits [R, T, V] and labels disagree
    if labels.shape != input_ids.shape:
        raise ValueError("Logits (batch and sequence length dim) and labels must have the same shape.")


def concatenated_forward_maker(spec: PairedForward):
    """The `make` of the `concatenated_forward` patch of the trainer `spec` declares."""

    def make(original):
        @functools.wraps(original)
        def concatenated_forward(self, model, batch):
            lm_head, causal_lm = lean_head(self, model, spec.name)
            if lm_head is None:
                record_fallback(self, f"stock's full-logits forward runs: {causal_lm}", 0)
                return original(self, model, batch)
            concatenated = self.concatenated_inputs(
                batch, is_encoder_decoder=False, padding_value=spec.padding_value(self), device=self.accelerator.device
            )
            num_chosen = batch["chosen_labels"].shape[0]
            input_ids = concatenated["concatenated_input_ids"]
            attention_mask = concatenated["concatenated_attention_mask"]
            labels = concatenated["concatenated_labels"]
            check_label_shape(labels, input_ids)
            nll_labels = spec.nll_labels(self, input_ids, attention_mask, labels)
            model_kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
            packed = paired_layout(self, causal_lm, input_ids, attention_mask, labels, model_kwargs)
            outputs, stats = lean_policy_forward(
                model,
                lm_head,
                causal_lm,
                input_ids,
                attention_mask,
                model_kwargs,
                packed,
                labels=labels,
                num_chosen=num_chosen,
                average_log_prob=spec.average_log_prob(self),
                nll_labels=nll_labels,
                logits_drop_last=spec.logits_drop_last,
            )
            dtype = outputs.logits.dtype  # stock's logits dtype: its log-probs and NLL come out in it
            # no NLL target (CPO with cpo_alpha == 0): stock's constant
            nll = torch.tensor(0.0).to(self.accelerator.device) if nll_labels is None else stats.chosen_nll.to(dtype)
            logps = stats.logps.to(dtype)
            result = (
                logps[:num_chosen],
                logps[num_chosen:],
                stats.chosen_mean_logits.to(dtype),
                stats.rejected_mean_logits.to(dtype),
                nll,
            )
            return (*result, outputs.aux_loss) if self.aux_loss_enabled else result

        return concatenated_forward

    return make
