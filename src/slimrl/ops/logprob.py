"""Drop-in replacement for TRL 1.16's `trl.trainer.utils.add_fused_lm_head`, scoring only the labelled tokens.

`add_fused_lm_head(model, temperature, cast_lm_head_to_fp32, outputs)` has TRL's signature and semantics (the
`FusedCausalLMOutput` fields, zeros at label -100, the loss formula, `shift_labels`, `num_items_in_batch`,
softcapping / logit-scale config lookups, the MoE aux loss). Only memory and time differ:

1. Every device scores only `label != -100` positions ("compact"); stock TRL does that only on CUDA/XPU with Triton
   and scores prompt and padding positions too everywhere else. Outputs are scattered back with `masked_scatter`, so
   they stay connected to the graph even when every label is -100.
2. Devices with Triton (CUDA/XPU) keep TRL's `ChunkedLogProbFunction` (its Triton fold is good); other devices use
   `slimrl.ops.lean_logprob.LeanLogProbFunction` (row chunks, in-place fold, entropy backward skipped when unused).
3. The chunking knob (slimrl.ops.chunking) is read at CALL time from the model the head was installed on (the base
   model under PEFT); on Triton devices N >= 1 chunks run TRL's kernel once per chunk.
The non-fused path is the original forward; `functools.wraps(type(model).forward)` keeps the signature `generate`
validates kwargs against. TRL's private helpers this module uses are listed in TRL_SYMBOLS, which the registry checks
at patch time like any other seam.
4. `fused_head_installed(model)`: the same head for the duration of one call only, for trainers whose TRL code never
   installs one (experimental OnlineDPO, A2PO): the model instance keeps nothing afterwards.
5. One head per model object: TRL's trainers install theirs in `__init__` (SFT, DPO, GRPO, ...), so an SFT run then a
   GRPO run on one model would stack two heads (every forward, generation's included, through both). A model whose
   forward is slimrl's head already keeps it, with the new trainer's settings (temperature, fp32 cast, outputs), as
   the top head of a stack answers every fused call anyway: the numbers are the same, one frame fewer per forward.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from contextlib import contextmanager, nullcontext

import torch
import transformers
from packaging.version import Version

from ..swaps import restore, swap
from .chunking import chunk_bounds, num_chunks_of, resolve_num_chunks
from .lean_logprob import LeanLogProbFunction

HEAD_MARK = "__slimrl_fused_head__"  # on slimrl's forward function: its FusedHeadSettings
# TRL names read here, (module, name, leading parameters or None): checked by the registry with the head's patch
TRL_SYMBOLS = (
    ("trl.kernels.chunked_logprob", "ChunkedLogProbFunction", None),
    ("trl.kernels.chunked_logprob", "_use_triton", ("device",)),
    ("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE", None),
    ("trl.trainer.utils", "FusedCausalLMOutput", None),
    ("trl.trainer.utils", "maybe_gather_lm_head_ctx", None),
)


def logit_postprocessing(text_config) -> tuple[float | None, float]:
    """(final-logit softcap, logit scale) a model applies after its LM head, looked up as TRL 1.16 does."""
    logit_scale = getattr(text_config, "logit_scale", None)
    if logit_scale is None:
        logit_scale = getattr(text_config, "output_multiplier", None)
    if logit_scale is None:
        logit_scale = getattr(text_config, "lm_head_multiplier", None)
    if logit_scale is None and getattr(text_config, "logits_scaling", None) is not None:
        logits_scaling = text_config.logits_scaling
        logit_scale = logits_scaling if text_config.model_type == "hyperclovax" else 1 / logits_scaling
    softcap = getattr(text_config, "final_logit_softcapping", None)
    return softcap, 1.0 if logit_scale is None else logit_scale


def fused_logprobs(hidden, weight, bias, targets, temperature, softcap, logit_scale, outputs, num_chunks=-1):
    """Per-token `(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)` of already-compact `hidden` [N, H]."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
    from trl.trainer import utils as trl_utils

    N, V = hidden.shape[0], weight.shape[0]
    if _use_triton(hidden.device):
        vocab_tile = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
        if num_chunks is None or num_chunks < 1 or N == 0:
            return ChunkedLogProbFunction.apply(
                hidden, weight, bias, targets, temperature, vocab_tile, softcap, logit_scale, outputs
            )
        parts = [
            ChunkedLogProbFunction.apply(
                hidden[s:e], weight, bias, targets[s:e], temperature, vocab_tile, softcap, logit_scale, outputs
            )
            for s, e in chunk_bounds(N, num_chunks)
        ]
        return tuple(None if xs[0] is None else torch.cat(xs) for xs in zip(*parts))
    buffers = 2 if ("entropy" in outputs or "log_sum_sq_probs" in outputs) else 1
    chunks = resolve_num_chunks(N, V, num_chunks, buffers=buffers)
    return LeanLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunks, softcap, logit_scale, outputs)


def _passthrough_kwargs(kwargs: dict, labels, shift_labels, num_items_in_batch) -> dict:
    """The original forward's keyword arguments when the fused head is not asked for."""
    extra = (("labels", labels), ("shift_labels", shift_labels), ("num_items_in_batch", num_items_in_batch))
    return {**kwargs, **{name: value for name, value in extra if value is not None}}


def _head_weights(lm_head):
    """The LM head's weight and bias as plain tensors (an FSDP2 DTensor is gathered once, as TRL does)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return lm_head.weight, lm_head.bias
    weight, bias = lm_head.weight, lm_head.bias
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None else None
    return weight, bias


def _moe_aux_loss(model, text_config, backbone_outputs, attention_mask):
    """The MoE load-balancing loss TRL adds (Mixtral's function, which every MoE family pulls in)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    if text_config.model_type == "gpt_oss" and Version(transformers.__version__) < Version("5.6.0"):
        num_experts = model.num_experts  # GptOssConfig has no num_experts before transformers 5.6 (TRL #5754)
    else:
        num_experts = text_config.num_experts
    return load_balancing_loss_func(
        backbone_outputs.router_logits, num_experts, text_config.num_experts_per_tok, attention_mask
    )


def _scored_outputs(model, hidden_states, labels, temperature, cast_lm_head_to_fp32, outputs, softcap, logit_scale):
    """(per-token output tuple, label mask) for the positions whose label is not -100."""
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    lm_head = model.get_output_embeddings()
    hidden_states = hidden_states.to(lm_head.weight.device)
    labels = labels.to(lm_head.weight.device)
    mask = labels != -100
    autocast_ctx = nullcontext()
    if cast_lm_head_to_fp32:
        hidden_states = hidden_states.float()
        autocast_ctx = torch.autocast(hidden_states.device.type, enabled=False)
    weight, bias = _head_weights(lm_head)
    with autocast_ctx, maybe_gather_lm_head_ctx(weight, bias):
        per_token = fused_logprobs(
            hidden_states[mask],
            weight,
            bias,
            labels[mask],
            temperature,
            softcap,
            logit_scale,
            outputs,
            num_chunks=num_chunks_of(model),
        )
    # `masked_scatter` keeps the outputs connected to the model even when no label is valid (as TRL does)
    return tuple(None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in per_token), mask


@dataclasses.dataclass
class FusedHeadSettings:
    """What one installed head scores with; a second install on the same model changes these, nothing else."""

    temperature: float
    cast_lm_head_to_fp32: bool
    outputs: tuple[str, ...]

    def assign(self, other: FusedHeadSettings) -> None:
        self.temperature, self.cast_lm_head_to_fp32, self.outputs = (
            other.temperature,
            other.cast_lm_head_to_fp32,
            other.outputs,
        )


def installed_head(model) -> FusedHeadSettings | None:
    """The settings of slimrl's head when it is `model`'s current forward (an instance attribute), else None."""
    return getattr(getattr(model.__dict__.get("forward"), "__func__", None), HEAD_MARK, None)


def add_fused_lm_head(
    model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False, outputs: tuple[str, ...] = ("log_probs",)
) -> None:
    """Patch `model.forward` so `model(..., labels=labels, fused_lm_head=True)` returns a `FusedCausalLMOutput`.

    Same contract as `trl.trainer.utils.add_fused_lm_head`; see the module docstring for what differs (memory/time).
    Idempotent per model object (choice 5): on a model whose forward is slimrl's head already, only the settings change.
    """
    settings = FusedHeadSettings(temperature, cast_lm_head_to_fp32, tuple(outputs))
    current = installed_head(model)
    if current is not None:
        current.assign(settings)
        return
    from trl.trainer.utils import FusedCausalLMOutput

    original_forward = model.forward
    text_config = model.config.get_text_config()
    softcap, logit_scale = logit_postprocessing(text_config)

    @functools.wraps(type(model).forward)
    def _fused_forward(
        self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs
    ):
        if not fused_lm_head:
            return original_forward(*args, **_passthrough_kwargs(kwargs, labels, shift_labels, num_items_in_batch))
        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        backbone_outputs = self.base_model(*args, **kwargs)
        hidden_states = backbone_outputs.last_hidden_state
        if shift_labels is None:
            hidden_states, labels = hidden_states[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        per_token, mask = _scored_outputs(
            self,
            hidden_states,
            labels,
            settings.temperature,
            settings.cast_lm_head_to_fp32,
            settings.outputs,
            softcap,
            logit_scale,
        )
        log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 = per_token
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        aux_loss = None
        if kwargs.get("output_router_logits"):
            aux_loss = _moe_aux_loss(self, text_config, backbone_outputs, kwargs.get("attention_mask"))
            loss = loss + getattr(text_config, "router_aux_loss_coef", 0.0) * aux_loss
        return FusedCausalLMOutput(
            loss=loss,
            log_probs=log_probs,
            entropy=entropy,
            log_sum_sq_probs=log_sum_sq_probs,
            mean_logits=mean_logits,
            is_top1=is_top1,
            label_mask=mask,
            aux_loss=aux_loss,
        )

    setattr(_fused_forward, HEAD_MARK, settings)
    swap(model, "forward", types.MethodType(_fused_forward, model), "fused LM head (slimrl.ops.logprob)")


@contextmanager
def fused_head_installed(model, temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",)):
    """While active, `model(..., labels= | shift_labels=, fused_lm_head=True)` runs slimrl's head (add_fused_lm_head);
    on exit the model is as before: the swap undone (slimrl.swaps.restore), or a head already there given back its
    settings."""
    before = installed_head(model)
    kept = None if before is None else dataclasses.replace(before)
    add_fused_lm_head(model, temperature, False, outputs)
    try:
        yield model
    finally:
        if kept is None:
            restore(model, "forward")
        else:
            before.assign(kept)
