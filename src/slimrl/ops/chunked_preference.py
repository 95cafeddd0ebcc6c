"""Lean policy forward for TRL's paired-preference trainers (experimental ORPO / CPO): no `[2B, T, V]` logits.

Stock `concatenated_forward` keeps `outputs.logits` [R = 2B, T, V] and derives from it (causal shift: position t
predicts token t+1; `z = lm_head(h)` after the model's own softcap / scale):

    logp[r, t]   = z[r, t, y] - logsumexp_v z[r, t, v]            (y = the target token of position t)
    logps[r]     = sum_t m[r, t] logp[r, t]   (/ sum_t m[r, t] when `average_log_prob`)   m = label != -100
    chosen_nll   = -sum_{r<B, t} n[r, t] logp_nll[r, t] / sum_{r<B, t} n[r, t]   (`nn.CrossEntropyLoss`, mean)
    logits/{chosen,rejected} metric = mean over rows x positions x V of z   (ORPO drops the last position)

Here the same quantities come from the decoder's last hidden states [R, T, H] and `lm_head.weight`:

* `token_stats` scores only positions with a target, through `LeanLogProbFunction` (row chunks over the full
  vocabulary, one reused fp32 buffer, recompute in backward: neither pass ever holds more than one chunk of
  logits). Positions with no target (prompt for CPO, padding, last position) only feed the mean-logits metric: a
  no-grad chunked pass sums their logits. The Function is reused rather than `torch.utils.checkpoint` per chunk
  (not measured, by construction): a checkpointed chunk's recompute + autograd backward holds the chunk's logits,
  its log-softmax and the logits gradient as separate tiles (3+ per chunk, more with softcap), and every chunk
  adds its own `[V, H]` weight-gradient term to the graph; the Function folds each chunk in place in one fp32 tile
  and accumulates the weight gradient in one buffer.
* Two target sets (ORPO: log-probs on the completion labels, NLL on every attended token): the first set's target
  is scored; the NLL target is scored again only where both exist and differ (never with TRL's collator, where a
  label equals the input id).
* Log-probs and NLL are computed in fp32 from fp32 logits chunks (stock: in the logits dtype) and then cast to the
  dtype stock's logits would have had, so returned dtypes match stock; in fp32 the values match to rounding.
* `capture_lm_head` runs the model through its normal `__call__` (DDP / PEFT / autocast / ZeRO-3 hooks as stock) and
  swaps only `lm_head.forward` for the duration: the computation happens inside the head, which returns a
  4-column probe `[R, T, 4]` instead of `[R, T, V]`. The model's post-processing of that probe (softcap, logit scale)
  is checked against slimrl's transform, so a model with a different logit post-processing raises instead of
  giving different numbers. The probe carries the statistics as graph inputs (`GraphCarrier`), so DDP's search
  for unused parameters, which starts from the forward's outputs, sees the weights the loss uses.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

from ..swaps import restore, swap
from .chunking import AUTO_CHUNKS, chunk_bounds, num_chunks_of, resolve_num_chunks
from .lean_logprob import ChunkProjector, LeanLogProbFunction, transform_logits_
from .logprob import logit_postprocessing

IGNORE = -100


@torch.no_grad()
def vocab_mean_logits(hidden, weight, bias, softcap=None, logit_scale=1.0, num_chunks=AUTO_CHUNKS) -> torch.Tensor:
    """fp32 [N]: mean over the vocabulary of the transformed logits of each row of `hidden` [N, H], in row chunks."""
    N, V = hidden.shape[0], weight.shape[0]
    out = torch.empty(N, device=hidden.device, dtype=torch.float32)
    if N == 0:
        return out
    projector = ChunkProjector(hidden, weight, bias, chunk_bounds(N, resolve_num_chunks(N, V, num_chunks, buffers=1)))
    with torch.autocast(hidden.device.type, enabled=False):
        for start, end, z in projector:
            torch.sum(transform_logits_(z, logit_scale, softcap, 1.0), dim=1, out=out[start:end])
    return out.div_(V)


def token_stats(hidden, weight, bias, targets, softcap=None, logit_scale=1.0, num_chunks=AUTO_CHUNKS):
    """Per row of `hidden` [N, H]: `(log_probs [N], mean_logits [N])`.

    log_probs[n] = z[n, targets[n]] - logsumexp(z[n]) with gradient (0 where targets[n] == -100);
    mean_logits[n] = mean_v z[n, v], fp32, no gradient. `num_chunks`: the knob (slimrl.ops.chunking).
    """
    scored = targets != IGNORE
    V = weight.shape[0]
    n_scored = int(scored.sum())
    chunks = resolve_num_chunks(n_scored, V, num_chunks, buffers=1)
    lp, _, _, mean_scored, _ = LeanLogProbFunction.apply(
        hidden[scored], weight, bias, targets[scored], 1.0, chunks, softcap, logit_scale, ("mean_logits",)
    )
    # `masked_scatter` keeps the output connected to the graph even when nothing is scored
    log_probs = lp.new_zeros(targets.shape).masked_scatter(scored, lp)
    mean_logits = torch.empty(targets.shape, device=hidden.device, dtype=torch.float32)
    mean_logits[scored] = mean_scored
    mean_logits[~scored] = vocab_mean_logits(
        hidden.detach()[~scored],
        weight.detach(),
        None if bias is None else bias.detach(),
        softcap,
        logit_scale,
        num_chunks,
    )
    return log_probs, mean_logits


class PreferenceStats(NamedTuple):
    """What stock's `concatenated_forward` derives from its `[R, T, V]` logits (rows: chosen first, then rejected)."""

    logps: torch.Tensor  # [R] sum (or mean, `average_log_prob`) of label log-probs; gradient
    token_counts: torch.Tensor  # [R] number of labelled tokens
    chosen_nll: torch.Tensor | None  # scalar: mean NLL over the chosen rows' NLL targets; gradient
    chosen_mean_logits: torch.Tensor  # scalar, fp32: mean of the chosen rows' logits over positions x vocab
    rejected_mean_logits: torch.Tensor


def _shift(labels: torch.Tensor) -> torch.Tensor:
    """Target of position t = label of t+1; the last position has none."""
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE)], dim=1)


def preference_stats(
    hidden,
    weight,
    bias,
    labels,
    *,
    num_chosen: int,
    average_log_prob: bool,
    nll_labels=None,
    logits_drop_last: bool = False,
    softcap=None,
    logit_scale=1.0,
    num_chunks=AUTO_CHUNKS,
) -> PreferenceStats:
    """Stock's per-sequence log-probs, chosen NLL and mean-logits metrics from `hidden` [R, T, H] (decoder-only).

    labels [R, T]: the log-prob labels (-100 = ignored), unshifted as in TRL. nll_labels [R, T] or None: the NLL
    labels (only the first `num_chosen` rows are used). `logits_drop_last`: the mean-logits metric leaves out the
    last position (ORPO slices `logits[:, :-1]`; CPO keeps every position).
    """
    R, T, H = hidden.shape
    flat_hidden = hidden.reshape(R * T, H)
    tgt = _shift(labels)
    primary = tgt
    extra = None
    if nll_labels is not None:
        tgt_nll = _shift(nll_labels)
        tgt_nll[num_chosen:] = IGNORE
        primary = torch.where(tgt != IGNORE, tgt, tgt_nll)
        extra = (tgt != IGNORE) & (tgt_nll != IGNORE) & (tgt_nll != tgt)
    log_probs, mean_logits = token_stats(
        flat_hidden, weight, bias, primary.reshape(-1), softcap, logit_scale, num_chunks
    )
    log_probs = log_probs.view(R, T)

    mask = tgt != IGNORE
    token_counts = mask.sum(-1)
    logps = (log_probs * mask).sum(-1)
    if average_log_prob:
        logps = logps / token_counts  # 0/0 = nan for a row without labels, as stock

    chosen_nll = None
    if nll_labels is not None:
        nll_mask = tgt_nll != IGNORE
        nll_logp = log_probs
        if bool(extra.any()):
            extra_lp, _ = token_stats(
                flat_hidden[extra.reshape(-1)], weight, bias, tgt_nll[extra], softcap, logit_scale, num_chunks
            )
            nll_logp = log_probs.masked_scatter(extra, extra_lp)
        chosen_mask = nll_mask[:num_chosen]
        chosen_nll = -(nll_logp[:num_chosen] * chosen_mask).sum() / chosen_mask.sum()

    positions = T - 1 if logits_drop_last else T
    mean_logits = mean_logits.view(R, T)[:, :positions]
    return PreferenceStats(
        logps, token_counts, chosen_nll, mean_logits[:num_chosen].mean(), mean_logits[num_chosen:].mean()
    )


# ---------------------------------------------------------------------------------------------------------------
# Running the model with the head swapped


PROBE_COLUMNS = 4


def transformed_probe_matches(probe: torch.Tensor, returned: torch.Tensor, softcap, logit_scale) -> bool:
    """Does the model's post-processing of the head output (`returned`) equal slimrl's transform of `probe`?"""
    if returned.shape != probe.shape:
        return False
    expected = transform_logits_(probe.detach().float().clone(), logit_scale, softcap, 1.0)
    low = probe.dtype != torch.float32 or returned.dtype != torch.float32
    tol = 2e-2 if low else 1e-5
    return bool(torch.allclose(returned.detach().float(), expected, rtol=tol, atol=tol))


@contextmanager
def capture_lm_head(lm_head: torch.nn.Module, head_fn):
    """While active, `lm_head(hidden)` returns `head_fn(hidden)`; module hooks still run (only `forward` is swapped).

    accelerate's big-model hooks keep the real forward in `_old_forward` and call it from their wrapper: that one
    is swapped instead, so their device placement / offload hooks still run first.
    """
    attr = "_old_forward" if hasattr(lm_head, "_hf_hook") and hasattr(lm_head, "_old_forward") else "forward"
    swap(lm_head, attr, head_fn, "the lean head computes the statistics (slimrl.ops.chunked_preference)")
    try:
        yield
    finally:
        restore(lm_head, attr)


def probe_columns(vocab: int, device) -> torch.Tensor:
    return torch.linspace(0, vocab - 1, PROBE_COLUMNS, device=device).long().unique()


def lean_head_or_reason(model, unwrap=None):
    """`(lm_head, causal_lm)` of `model` (DDP / PEFT unwrapped) when the lean head applies, else `(None, reason)`."""
    unwrapped = unwrap(model) if unwrap is not None else model
    causal_lm = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
    get_head = getattr(causal_lm, "get_output_embeddings", None)
    lm_head = get_head() if callable(get_head) else None
    # Exact type: a LoRA / modules_to_save wrapper or a quantized Linear computes more than `h @ W.T + b`
    if type(lm_head) is not torch.nn.Linear:
        return None, f"its output embedding is {type(lm_head).__name__}, not a plain torch.nn.Linear"
    return lm_head, causal_lm


def _carries_gradient(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


class GraphCarrier(torch.autograd.Function):
    """The probe, unchanged, with the statistics as inputs of its graph node; no gradient reaches them through it.

    The statistics the loss uses leave the model's forward only through the lean head's box, not its outputs. DDP
    with `find_unused_parameters=True` walks the graph back from the forward's outputs to see which parameters were
    used: without this node it would mark every LoRA weight unused at the end of the forward and then fail when the
    loss's gradients reach them ("Expected to mark a variable ready only once").
    """

    @staticmethod
    def forward(ctx, probe, *statistics):
        ctx.num_statistics = len(statistics)
        return probe.clone()

    @staticmethod
    def backward(ctx, grad_probe):
        return (grad_probe, *([None] * ctx.num_statistics))


def lean_policy_forward(
    model, lm_head, causal_lm, input_ids, attention_mask, model_kwargs: dict, packed=None, **stats_kwargs
):
    """`model(input_ids, attention_mask=..., use_cache=False, **model_kwargs)` as stock calls it, with the lm_head
    swapped for `preference_stats(hidden, ..., **stats_kwargs)`. Returns `(outputs, stats)`; `outputs.logits` is the
    4-column probe, in the dtype stock's logits would have had.

    `packed` (a whole-row `slimrl.ops.shared_prefix.PackedPrefixBatch` of these rows): the model runs the packed rows
    instead, and the head reads their hidden states back in the rows' layout (`unpack_rows`), so the statistics are
    the per-row forward's.
    """
    from .shared_prefix import model_inputs, unpack_rows

    softcap, logit_scale = logit_postprocessing(causal_lm.config.get_text_config())
    num_chunks = num_chunks_of(causal_lm)
    weight, bias = lm_head.weight, lm_head.bias
    call = (
        dict(input_ids=input_ids, attention_mask=attention_mask) if packed is None else model_inputs(packed, causal_lm)
    )
    box = {}

    def head(hidden):
        if "stats" in box:
            raise RuntimeError("slimrl's lean preference head: the model called lm_head twice in one forward")
        if tuple(hidden.shape[:2]) != tuple(call["input_ids"].shape):
            raise RuntimeError(
                f"slimrl's lean preference head: lm_head got hidden states {tuple(hidden.shape)} for "
                f"input ids {tuple(call['input_ids'].shape)} (the model does not score every position)"
            )
        hidden = hidden.to(weight.device)
        rows_hidden = hidden if packed is None else unpack_rows(hidden, packed)
        box["stats"] = preference_stats(
            rows_hidden, weight, bias, softcap=softcap, logit_scale=logit_scale, num_chunks=num_chunks, **stats_kwargs
        )
        cols = probe_columns(weight.shape[0], weight.device)
        with torch.no_grad():
            box["probe"] = torch.nn.functional.linear(hidden, weight[cols], None if bias is None else bias[cols])
        return GraphCarrier.apply(box["probe"], *(x for x in box["stats"] if _carries_gradient(x)))

    with capture_lm_head(lm_head, head):
        outputs = model(**call, use_cache=False, **model_kwargs)
    if "stats" not in box:
        raise RuntimeError("slimrl's lean preference head: the model never called its lm_head")
    if not transformed_probe_matches(box["probe"], outputs.logits, softcap, logit_scale):
        raise RuntimeError(
            f"slimrl's lean preference head: {type(causal_lm).__name__} post-processes its lm_head output in a way "
            f"slimrl does not reproduce (softcap={softcap}, logit_scale={logit_scale} from the config). "
            "Use stock TRL for this model: slimrl.unpatch('orpo') / unpatch('cpo')."
        )
    return outputs, box["stats"]
