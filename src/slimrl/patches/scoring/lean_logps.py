"""Per-token log-probabilities through slimrl's head for TRL trainers that take them from full `[B, T, V]` logits.

TRL 1.16's experimental OnlineDPO (`_forward`) and A2PO (`_get_sequence_logps`) run `model(...)`, keep
`outputs.logits` for every position and vocabulary entry, take a `log_softmax` of it (a second `[B, T, V]` tensor)
and gather the completion tokens. Their patched seams call `scored_logprobs` instead: the model runs through its
normal `__call__` (DDP, PEFT, checkpointing and autocast as stock), with slimrl's fused head installed on the
transformers model for that call only (`slimrl.ops.logprob.fused_head_installed`), and `shift_labels` naming the
positions to score: only their hidden states meet the LM head, in bounded row chunks. The log-probs come back in
float32 (stock: in the logits' dtype, bfloat16 for a bfloat16 model without autocast).

A model whose output embedding is not a plain `nn.Linear` (LoRA on lm_head, `modules_to_save`, a quantized head)
computes more than `h @ W.T`: `lean_head_reason` names why, and the seam runs stock's code with a warning (the patch
applies class-wide; the numbers stay stock's), as ORPO/CPO's lean forward does.
"""

from __future__ import annotations

import warnings

import torch

from ...ops.chunked_preference import lean_head_or_reason
from ...ops.logprob import fused_head_installed
from ...state import transformers_model

IGNORE = -100


def lean_head_reason(trainer, model) -> str | None:
    """None when slimrl's head computes what `model`'s lm_head computes, else why not."""
    lm_head, found = lean_head_or_reason(model, trainer.accelerator.unwrap_model)
    return None if lm_head is not None else found


def warn_stock_path(seam: str, reason: str) -> None:
    warnings.warn(
        f"slimrl: {seam} runs stock TRL's full-logits path because {reason}; memory and numbers are stock's.",
        UserWarning,
        stacklevel=3,
    )


def scored_logprobs(trainer, model, input_ids, attention_mask, shift_labels, **model_kwargs) -> torch.Tensor:
    """[B, T] float32: at each position t with `shift_labels[:, t] != -100`, log p(shift_labels[:, t] | tokens <= t)
    from `model` called as stock calls it; 0 elsewhere. Differentiable when grad is enabled."""
    base = transformers_model(trainer.accelerator.unwrap_model(model))
    with fused_head_installed(base):
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            shift_labels=shift_labels,
            fused_lm_head=True,
            **model_kwargs,
        )
    return outputs.log_probs


def completion_labels(input_ids: torch.Tensor, start: int, targets: torch.Tensor) -> torch.Tensor:
    """`shift_labels` scoring `targets` [B, C] at positions start .. start + C - 1 of `input_ids` [B, T]."""
    labels = torch.full_like(input_ids, IGNORE)
    labels[:, start : start + targets.shape[1]] = targets
    return labels
