"""slimrl.ops.logprob.add_fused_lm_head vs TRL's add_fused_lm_head (stock, float32) and a naive full-logits head in
float64 (the reference), compared by the parity rule of tests/patches/_parity.py: slimrl's error against the
reference is at most K x TRL's own error plus a floor, so the suite holds on any CPU's rounding.

Odd vocabulary size, an all-masked row, chunk counts that do not divide the tokens; the negative control scales
slimrl's temperature by 1.001 and must fail the same comparison.
"""

from __future__ import annotations

import copy

import pytest
import torch
import trl.trainer.utils as trl_utils  # TRL's stock head: a moved module must fail this suite, not skip it

from slimrl.ops import chunking
from slimrl.ops.chunking import num_chunks_of, set_num_chunks
from slimrl.ops.lean_logprob import LeanLogProbFunction
from slimrl.ops.logprob import add_fused_lm_head, fused_logprobs
from slimrl.testing import tiny_llama

import _parity as P
from _reference import naive_fused_lm_head, naive_outputs

ALL = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
V = 777  # not a multiple of any tile or chunk


def _batch(seed=0, rows=3, T=19, vocab=V):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, T), generator=g)
    labels = ids.clone()
    labels[:, :7] = -100  # prompt
    labels[1, 12:] = -100  # right padding
    labels[2] = -100  # an all-masked row
    return ids, labels


def _triple(outputs=ALL, temperature=1.0, ours_temperature=None, **model_kwargs):
    """(slimrl's head, TRL's head, naive float64 head) on copies of one tiny model."""
    ours = tiny_llama(vocab_size=V, hidden_size=32, **model_kwargs)
    theirs, ref = copy.deepcopy(ours), copy.deepcopy(ours).to(torch.float64)
    add_fused_lm_head(ours, temperature=ours_temperature or temperature, outputs=outputs)
    trl_utils.add_fused_lm_head(theirs, temperature=temperature, outputs=outputs)
    naive_fused_lm_head(ref, temperature=temperature, outputs=outputs)
    return ours, theirs, ref


def _forward(models, **kwargs):
    return [m(**kwargs, fused_lm_head=True) for m in models]


def _check_outputs(outs, fields=ALL + ("loss",)):
    for field in fields:
        ours, theirs, ref = (getattr(o, field) for o in outs)
        if ours.dtype == torch.bool:
            assert torch.equal(ours, theirs) and torch.equal(ours, ref), field
        else:
            P.check(f"output {field}", ours.detach(), theirs.detach(), ref.detach())


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_grads(models):
    grads = [_grads(m) for m in models]
    assert grads[0] and grads[0].keys() == grads[1].keys() == grads[2].keys()
    for name in grads[0]:
        P.check(f"grad {name}", grads[0][name], grads[1][name], grads[2][name])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_grads_match_trl_and_naive(temperature, entropy_grad):
    models = _triple(temperature=temperature)
    ids, labels = _batch()
    outs = _forward(models, input_ids=ids, labels=labels)
    _check_outputs(outs)
    assert torch.equal(outs[0].label_mask, outs[1].label_mask)
    w = torch.linspace(-1, 1, outs[0].log_probs.numel()).view_as(outs[0].log_probs)
    for o in outs:
        ((w.to(o.log_probs.dtype) * o.log_probs).sum() + (0.3 * o.entropy.sum() if entropy_grad else 0)).backward()
    assert "lm_head.weight" in _grads(models[0])
    _check_grads(models)


def test_negative_control_temperature_off_by_a_thousandth():
    models = _triple(temperature=0.7, ours_temperature=0.7 * 1.001)
    ids, labels = _batch()
    with pytest.raises(AssertionError, match="output log_probs"):
        _check_outputs(_forward(models, input_ids=ids, labels=labels), ("log_probs",))


def test_tied_embeddings_full_finetune():
    models = _triple(outputs=("log_probs", "entropy"), tie_word_embeddings=True)
    assert models[0].lm_head.weight is models[0].model.embed_tokens.weight
    ids, labels = _batch(1)
    for out in _forward(models, input_ids=ids, labels=labels):
        out.loss.backward()
    _check_grads(models)


def test_lora_grads_and_knob_on_base_model():
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    models = [get_peft_model(m, copy.deepcopy(cfg)) for m in _triple(outputs=("log_probs", "entropy"))]
    for m in models[1:]:
        m.load_state_dict({k: v.to(next(m.parameters()).dtype) for k, v in models[0].state_dict().items()})
    set_num_chunks(models[0], 3)  # lands on the base model, read at call time
    assert num_chunks_of(models[0].get_base_model()) == 3
    ids, labels = _batch(2)
    outs = _forward(models, input_ids=ids, labels=labels)
    assert LeanLogProbFunction.last_forward_chunks == 3
    _check_outputs(outs, ("log_probs", "entropy", "loss"))
    for out in outs:
        out.loss.backward()
    assert all("lora" in n for n in _grads(models[0]))
    _check_grads(models)


@pytest.mark.parametrize("num_chunks", [1, 2, 5, 7, 1000])
def test_chunk_knob_acts_and_keeps_results(num_chunks):
    torch.manual_seed(0)
    N, H = 29, 16  # 29 tokens: no chunk count above divides it evenly
    hidden = torch.randn(N, H, requires_grad=True)
    weight = (torch.randn(V, H) * 0.3).requires_grad_()
    bias = (torch.randn(V) * 0.1).requires_grad_()
    targets = torch.randint(0, V, (N,))
    out = fused_logprobs(hidden, weight, bias, targets, 0.9, None, 1.0, ALL, num_chunks=num_chunks)
    assert LeanLogProbFunction.last_forward_chunks == min(num_chunks, N)
    grads = torch.autograd.grad(out[0].sum() + out[1].sum(), (hidden, weight, bias))
    assert LeanLogProbFunction.last_backward_chunks == min(num_chunks, N)
    # stock: TRL's tiled op on the same float32 inputs; reference: naive float64
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    stock = ChunkedLogProbFunction.apply(hidden, weight, bias, targets, 0.9, 256, None, 1.0, ALL)
    stock_grads = torch.autograd.grad(stock[0].sum() + stock[1].sum(), (hidden, weight, bias))
    h, w, b = (x.detach().double().requires_grad_() for x in (hidden, weight, bias))
    ref = naive_outputs((h @ w.T + b) / 0.9, targets)
    ref_grads = torch.autograd.grad(ref["log_probs"].sum() + ref["entropy"].sum(), (h, w, b))
    for name, ours_x, stock_x in zip(ALL, out, stock):
        if name == "is_top1":
            assert torch.equal(ours_x, stock_x) and torch.equal(ours_x, ref[name])
        else:
            P.check(f"chunks={num_chunks}: {name}", ours_x.detach(), stock_x.detach(), ref[name].detach())
    for name, g_ours, g_stock, g_ref in zip(("hidden", "weight", "bias"), grads, stock_grads, ref_grads):
        P.check(f"chunks={num_chunks}: grad {name}", g_ours, g_stock, g_ref)


def test_more_chunks_less_scratch_memory():
    """Peak allocated bytes of the op (CPU profiler) shrink as the chunk count grows; auto follows the budget."""
    from torch.profiler import ProfilerActivity, profile

    N, H, vocab = 64, 8, 4096
    hidden, weight = torch.randn(N, H, requires_grad=True), torch.randn(vocab, H)
    targets = torch.randint(0, vocab, (N,))

    def peak_bytes(num_chunks):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fused_logprobs(hidden, weight, None, targets, 1.0, None, 1.0, ("log_probs", "entropy"), num_chunks)
            out[0].sum().backward()
        return max(e.cpu_memory_usage for e in prof.key_averages())

    big, small = peak_bytes(1), peak_bytes(16)
    assert big >= 2 * N * vocab * 4  # two full [N, V] fp32 buffers when unchunked
    assert small * 8 < big

    old = chunking.AUTO_BUDGET_BYTES
    try:
        chunking.AUTO_BUDGET_BYTES = 2 * 4 * vocab * 10  # 10 rows per chunk
        fused_logprobs(hidden, weight, None, targets, 1.0, None, 1.0, ("log_probs", "entropy"), -1)
        assert LeanLogProbFunction.last_forward_chunks == 7  # ceil(64 / 10) chunks of at most 10 rows
    finally:
        chunking.AUTO_BUDGET_BYTES = old


def test_all_masked_stays_connected_and_one_token():
    models = _triple(outputs=("log_probs", "entropy"))
    ours = models[0]
    ids, labels = _batch(3)
    labels[:] = -100
    out = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    assert out.log_probs.requires_grad and torch.count_nonzero(out.log_probs) == 0
    out.loss.backward()  # a differentiable zero, not an error
    assert all(torch.count_nonzero(g) == 0 for g in _grads(ours).values())
    labels[0, 10] = ids[0, 10]  # exactly one scored token
    set_num_chunks(ours, 1000)  # one token per chunk: the chunk count is the number of scored positions
    outs = _forward(models, input_ids=ids, labels=labels)
    assert LeanLogProbFunction.last_forward_chunks == 1 and int(outs[0].label_mask.sum()) == 1  # prompt unscored
    _check_outputs(outs, ("log_probs", "entropy"))


def test_shift_labels_and_num_items_in_batch():
    models = _triple()
    ids, labels = _batch(4)
    shift = torch.cat([labels[:, 1:], torch.full((labels.shape[0], 1), -100)], 1)
    outs = _forward(models, input_ids=ids, shift_labels=shift, num_items_in_batch=13)
    assert outs[0].log_probs.shape == ids.shape
    _check_outputs(outs, ("loss", "log_probs"))
    unshifted = models[0](input_ids=ids, labels=labels, fused_lm_head=True)
    assert torch.equal(outs[0].log_probs[:, :-1], unshifted.log_probs)  # the same scored rows, the same chunks


@pytest.mark.parametrize(
    "config",
    [{"final_logit_softcapping": 2.5}, {"logit_scale": 0.5}, {"final_logit_softcapping": 4.0, "logits_scaling": 2.0}],
)
def test_softcap_and_logit_scale_configs(config):
    models = _triple(outputs=("log_probs", "entropy"), temperature=0.8, **config)
    ids, labels = _batch(5)
    outs = _forward(models, input_ids=ids, labels=labels)
    _check_outputs(outs, ("log_probs", "entropy"))
    for out in outs:
        (out.log_probs.sum() + out.entropy.sum()).backward()
    _check_grads(models)


def test_bf16_model_within_tolerance():
    ours, theirs, ref = _triple(outputs=("log_probs", "entropy"))
    ours.to(torch.bfloat16)
    ids, labels = _batch(6)
    out, ref_out = (m(input_ids=ids, labels=labels, fused_lm_head=True) for m in (ours, ref))
    assert out.log_probs.dtype == torch.float32  # the fold is fp32 like TRL's
    # bf16 weights: 8 bits of mantissa, logits off by ~|z| x 2^-8
    assert torch.allclose(out.log_probs, ref_out.log_probs.float(), atol=0.1, rtol=0.02)
    assert torch.allclose(out.entropy, ref_out.entropy.float(), atol=0.1, rtol=0.02)
    out.loss.backward()
    assert ours.lm_head.weight.grad.dtype == torch.bfloat16 and torch.isfinite(ours.lm_head.weight.grad).all()


def test_bf16_autocast_matches_trl():
    ours, theirs, _ = _triple(outputs=("log_probs", "entropy"))
    ids, labels = _batch(7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o1 = ours(input_ids=ids, labels=labels, fused_lm_head=True)
        o2 = theirs(input_ids=ids, labels=labels, fused_lm_head=True)
    assert torch.allclose(o1.log_probs, o2.log_probs, atol=2e-2, rtol=1e-2)
    o1.loss.backward()
    o2.loss.backward()
    g1, g2 = _grads(ours), _grads(theirs)
    for name in g2:
        assert torch.allclose(g1[name], g2[name], atol=5e-3, rtol=5e-2), name


def test_non_fused_path_is_original_forward_and_generate_works():
    model = tiny_llama(vocab_size=V, hidden_size=32)
    ids, _ = _batch(8)
    before = model(input_ids=ids).logits
    original_wrapped = type(model).forward
    add_fused_lm_head(model, outputs=("log_probs",))
    assert model.forward.__wrapped__ is original_wrapped  # functools.wraps: generate validates kwargs against it
    assert torch.equal(model(input_ids=ids).logits, before)
    out = model(input_ids=ids, labels=ids)
    assert out.logits is not None and out.loss is not None  # labels go to the original forward
    gen = model.generate(ids[:1, :5], max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, 8)
