"""Drop-in replacement for TRL 1.16's `trl.trainer.utils.add_fused_lm_head`, scoring only the labelled tokens.

`add_fused_lm_head(model, temperature, cast_lm_head_to_fp32, outputs)` has TRL's signature and semantics (the
`FusedCausalLMOutput` fields, zeros at label -100, the loss formula, `shift_labels`, `num_items_in_batch`,
softcapping / logit-scale config lookups, the MoE aux loss). Only memory and time differ:

* Every device scores only `label != -100` positions ("compact"); stock TRL does that only on CUDA/XPU with Triton
  and scores prompt and padding positions too everywhere else. Outputs are scattered back with `masked_scatter`, so
  they stay connected to the graph even when every label is -100.
* Devices with Triton (CUDA/XPU) keep TRL's `ChunkedLogProbFunction` (its Triton fold is good); other devices use
  `slimrl.ops.lean_logprob.LeanLogProbFunction` (row chunks, in-place fold, entropy backward skipped when unused).
* Chunking knob, read at CALL time from the model the head was installed on (the base model under PEFT):
  `model._slimrl_num_chunks` (-1 = auto from `lean_logprob.AUTO_BUDGET_BYTES`; N >= 1 = split the scored tokens
  into N chunks, Unsloth's `unsloth_num_chunks` semantics). On Triton devices N >= 1 runs TRL's kernel once per chunk.

The non-fused path is the original forward; `functools.wraps(type(model).forward)` keeps the signature `generate`
validates kwargs against. TRL's helpers (config lookups aside, which are copied for the same result) are imported.
"""

from __future__ import annotations

import functools
import types
from contextlib import nullcontext

import torch
import transformers
from packaging.version import Version

from .lean_logprob import LeanLogProbFunction, chunk_bounds, resolve_num_chunks

NUM_CHUNKS_ATTR = "_slimrl_num_chunks"


def _logit_scale_of(text_config) -> float:
    # Same lookups, same order as TRL 1.16's `add_fused_lm_head`
    logit_scale = getattr(text_config, "logit_scale", None)
    if logit_scale is None:
        logit_scale = getattr(text_config, "output_multiplier", None)
    if logit_scale is None:
        logit_scale = getattr(text_config, "lm_head_multiplier", None)
    if logit_scale is None and getattr(text_config, "logits_scaling", None) is not None:
        logits_scaling = text_config.logits_scaling
        logit_scale = logits_scaling if text_config.model_type == "hyperclovax" else 1 / logits_scaling
    return 1.0 if logit_scale is None else logit_scale


def fused_logprobs(hidden, weight, bias, targets, temperature, softcap, logit_scale, outputs, num_chunks=-1):
    """Per-token `(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)` of already-compact `hidden` [N, H]."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
    from trl.trainer import utils as trl_utils

    N, V = hidden.shape[0], weight.shape[0]
    if _use_triton(hidden.device):
        vocab_tile = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
        if num_chunks is None or num_chunks < 1 or N == 0:
            return ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, vocab_tile, softcap,
                                                logit_scale, outputs)
        parts = [ChunkedLogProbFunction.apply(hidden[s:e], weight, bias, targets[s:e], temperature, vocab_tile,
                                              softcap, logit_scale, outputs)
                 for s, e in chunk_bounds(N, num_chunks)]
        return tuple(None if xs[0] is None else torch.cat(xs) for xs in zip(*parts))
    buffers = 2 if ("entropy" in outputs or "log_sum_sq_probs" in outputs) else 1
    chunks = resolve_num_chunks(N, V, num_chunks, buffers=buffers)
    return LeanLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunks, softcap, logit_scale, outputs)


def add_fused_lm_head(model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False,
                      outputs: tuple[str, ...] = ("log_probs",)) -> None:
    """Patch `model.forward` so `model(..., labels=labels, fused_lm_head=True)` returns a `FusedCausalLMOutput`.

    Same contract as `trl.trainer.utils.add_fused_lm_head`; see the module docstring for what differs (memory/time).
    """
    from trl.trainer.utils import FusedCausalLMOutput, maybe_gather_lm_head_ctx

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()

    original_forward = model.forward
    text_config = model.config.get_text_config()
    final_logit_softcapping = getattr(text_config, "final_logit_softcapping", None)
    logit_scale = _logit_scale_of(text_config)
    backbone_attr = "base_model"
    if text_config is not model.config and Version(transformers.__version__) < Version("5.0.0"):
        backbone_attr = "model"

    @functools.wraps(type(model).forward)
    def _fused_forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                       **kwargs):
        if not fused_lm_head:
            if labels is not None:
                kwargs["labels"] = labels
            if shift_labels is not None:
                kwargs["shift_labels"] = shift_labels
            if num_items_in_batch is not None:
                kwargs["num_items_in_batch"] = num_items_in_batch
            return original_forward(*args, **kwargs)

        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        backbone_outputs = getattr(self, backbone_attr)(*args, **kwargs)
        if shift_labels is None:
            hidden_states = backbone_outputs.last_hidden_state[:, :-1]
            labels = labels[:, 1:]
        else:
            hidden_states = backbone_outputs.last_hidden_state
            labels = shift_labels
        lm_head = self.get_output_embeddings()
        hidden_states = hidden_states.to(lm_head.weight.device)
        labels = labels.to(lm_head.weight.device)
        mask = labels != -100
        autocast_ctx = nullcontext()
        if cast_lm_head_to_fp32:
            hidden_states = hidden_states.float()
            autocast_ctx = torch.autocast(hidden_states.device.type, enabled=False)

        weight, bias = lm_head.weight, lm_head.bias
        if DTensor and isinstance(weight, DTensor):
            weight = weight.full_tensor()
            if bias is not None:
                bias = bias.full_tensor()
        num_chunks = getattr(self, NUM_CHUNKS_ATTR, -1)
        with autocast_ctx, maybe_gather_lm_head_ctx(weight, bias):
            per_token = fused_logprobs(hidden_states[mask], weight, bias, labels[mask], temperature,
                                       final_logit_softcapping, logit_scale, outputs, num_chunks=num_chunks)
        # `masked_scatter` keeps the outputs connected to the model even when no label is valid (as TRL does)
        log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 = (
            None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in per_token
        )
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)

        aux_loss = None
        if kwargs.get("output_router_logits"):
            from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

            if Version(transformers.__version__) < Version("5.0.0"):
                num_experts, num_experts_per_tok = self.num_experts, self.num_experts_per_tok
            elif text_config.model_type == "gpt_oss" and Version(transformers.__version__) < Version("5.6.0"):
                num_experts, num_experts_per_tok = self.num_experts, text_config.num_experts_per_tok
            else:
                num_experts, num_experts_per_tok = text_config.num_experts, text_config.num_experts_per_tok
            aux_loss = load_balancing_loss_func(
                backbone_outputs.router_logits, num_experts, num_experts_per_tok, kwargs.get("attention_mask")
            )
            loss = loss + getattr(text_config, "router_aux_loss_coef", 0.0) * aux_loss

        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq_probs,
                                   mean_logits=mean_logits, is_top1=is_top1, label_mask=mask, aux_loss=aux_loss)

    model.forward = types.MethodType(_fused_forward, model)


def set_num_chunks(model, num_chunks: int) -> None:
    """Set the chunking knob on `model` (the base model under PEFT): -1 = auto, N >= 1 = N chunks."""
    if not isinstance(num_chunks, int) or (num_chunks < 1 and num_chunks != -1):
        raise ValueError(f"slimrl_num_chunks must be -1 (auto) or an integer >= 1, got {num_chunks!r}")
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    setattr(target, NUM_CHUNKS_ATTR, num_chunks)
