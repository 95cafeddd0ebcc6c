"""slimrl.ops.logprob.add_fused_lm_head vs TRL's add_fused_lm_head and a naive full-logits reference."""

from __future__ import annotations

import copy

import pytest
import torch

from slimrl.ops import lean_logprob
from slimrl.ops.lean_logprob import LeanLogProbFunction
from slimrl.ops.logprob import NUM_CHUNKS_ATTR, add_fused_lm_head, fused_logprobs, set_num_chunks
from slimrl.testing import tiny_llama

trl_utils = pytest.importorskip("trl.trainer.utils")
ALL = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
V = 777  # not a multiple of any tile or chunk


def _naive(model, ids, labels, temperature=1.0, softcap=None, logit_scale=1.0):
    """Full logits -> log_softmax(z / T) gathered, entropy etc.; zeros at -100 (the reference semantics)."""
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
    z = model.lm_head(hidden).float() * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    labels = labels[:, 1:]
    mask = labels != -100
    logp_all = torch.log_softmax(z, -1)
    lp = logp_all.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    ent = -(p * logp_all).sum(-1)
    zero = torch.zeros_like(lp)
    return {
        "log_probs": torch.where(mask, lp, zero),
        "entropy": torch.where(mask, ent, zero),
        "log_sum_sq_probs": torch.where(mask, torch.logsumexp(2 * logp_all, -1), zero),
        "mean_logits": torch.where(mask, z.mean(-1), zero),
        "is_top1": mask & (z.argmax(-1) == labels),
        "loss": -torch.where(mask, lp, zero).sum() / mask.sum().clamp(min=1),
    }


def _batch(seed=0, rows=3, T=19, vocab=V):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, T), generator=g)
    labels = ids.clone()
    labels[:, :7] = -100  # prompt
    labels[1, 12:] = -100  # right padding
    labels[2] = -100  # an all-masked row
    return ids, labels


def _pair(outputs=ALL, temperature=1.0, **model_kwargs):
    ours = tiny_llama(vocab_size=V, hidden_size=32, **model_kwargs)
    theirs = copy.deepcopy(ours)
    add_fused_lm_head(ours, temperature=temperature, outputs=outputs)
    trl_utils.add_fused_lm_head(theirs, temperature=temperature, outputs=outputs)
    return ours, theirs


def _close(a, b, rtol=1e-5, atol=1e-6):
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_grads_match_trl_and_naive(temperature, entropy_grad):
    ours, theirs = _pair(temperature=temperature)
    ref_model = copy.deepcopy(theirs)
    ids, labels = _batch()
    o1 = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    o2 = theirs(input_ids=ids, labels=labels, fused_lm_head=True)
    ref = _naive(ref_model, ids, labels, temperature)
    for field in ALL + ("loss",):
        assert _close(getattr(o1, field), getattr(o2, field)), field
        assert _close(getattr(o1, field), ref[field]), field
    assert torch.equal(o1.label_mask, o2.label_mask)
    w = torch.linspace(-1, 1, o1.log_probs.numel()).view_as(o1.log_probs)

    def objective(o):
        return (w * o["log_probs"]).sum() + (0.3 * o["entropy"].sum() if entropy_grad else 0)

    objective(o1).backward()
    objective(o2).backward()
    objective(ref).backward()
    g1, g2, g3 = _grads(ours), _grads(theirs), _grads(ref_model)
    assert g1.keys() == g2.keys() and "lm_head.weight" in g1
    for name in g1:
        scale = g3[name].abs().max().clamp(min=1e-8)
        assert (g1[name] - g2[name]).abs().max() / scale < 1e-5, name
        assert (g1[name] - g3[name]).abs().max() / scale < 1e-5, name


def test_tied_embeddings_full_finetune():
    ours, theirs = _pair(outputs=("log_probs", "entropy"), tie_word_embeddings=True)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ids, labels = _batch(1)
    for m in (ours, theirs):
        m(input_ids=ids, labels=labels, fused_lm_head=True).loss.backward()
    g1, g2 = _grads(ours), _grads(theirs)
    for name in g2:
        assert torch.allclose(g1[name], g2[name], rtol=1e-5, atol=1e-7), name


def test_lora_grads_and_knob_on_base_model():
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    ours, theirs = _pair(outputs=("log_probs", "entropy"))
    ours, theirs = get_peft_model(ours, copy.deepcopy(cfg)), get_peft_model(theirs, copy.deepcopy(cfg))
    theirs.load_state_dict(ours.state_dict())
    set_num_chunks(ours, 3)  # lands on the base model, read at call time
    assert getattr(ours.get_base_model(), NUM_CHUNKS_ATTR) == 3
    ids, labels = _batch(2)
    o1 = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    o2 = theirs(input_ids=ids, labels=labels, fused_lm_head=True)
    assert LeanLogProbFunction.last_forward_chunks == 3
    assert _close(o1.log_probs, o2.log_probs) and _close(o1.entropy, o2.entropy)
    o1.loss.backward()
    o2.loss.backward()
    g1, g2 = _grads(ours), _grads(theirs)
    assert g1 and all("lora" in n for n in g1) and g1.keys() == g2.keys()
    for name in g1:
        assert torch.allclose(g1[name], g2[name], rtol=1e-5, atol=1e-8), name


@pytest.mark.parametrize("num_chunks", [1, 2, 5, 7, 1000])
def test_chunk_knob_acts_and_keeps_results(num_chunks):
    torch.manual_seed(0)
    N, H = 29, 16  # 29 tokens: no chunk count above divides it evenly
    hidden = torch.randn(N, H, requires_grad=True)
    weight = (torch.randn(V, H) * 0.3).requires_grad_()
    bias = (torch.randn(V) * 0.1).requires_grad_()
    targets = torch.randint(0, V, (N,))
    ref_out = fused_logprobs(hidden, weight, bias, targets, 0.9, None, 1.0, ALL, num_chunks=1)
    ref_grads = torch.autograd.grad(ref_out[0].sum() + ref_out[1].sum(), (hidden, weight, bias))
    out = fused_logprobs(hidden, weight, bias, targets, 0.9, None, 1.0, ALL, num_chunks=num_chunks)
    assert LeanLogProbFunction.last_forward_chunks == min(num_chunks, N)
    grads = torch.autograd.grad(out[0].sum() + out[1].sum(), (hidden, weight, bias))
    assert LeanLogProbFunction.last_backward_chunks == min(num_chunks, N)
    for a, b in zip(out, ref_out):
        assert _close(a, b)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


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

    old = lean_logprob.AUTO_BUDGET_BYTES
    try:
        lean_logprob.AUTO_BUDGET_BYTES = 2 * 4 * vocab * 10  # 10 rows per chunk
        fused_logprobs(hidden, weight, None, targets, 1.0, None, 1.0, ("log_probs", "entropy"), -1)
        assert LeanLogProbFunction.last_forward_chunks == 7  # ceil(64 / 10) chunks of at most 10 rows
    finally:
        lean_logprob.AUTO_BUDGET_BYTES = old


def test_all_masked_stays_connected_and_one_token():
    ours, theirs = _pair(outputs=("log_probs", "entropy"))
    ids, labels = _batch(3)
    labels[:] = -100
    out = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    assert out.log_probs.requires_grad and torch.count_nonzero(out.log_probs) == 0
    out.loss.backward()  # a differentiable zero, not an error
    assert all(torch.count_nonzero(g) == 0 for g in _grads(ours).values())
    labels[0, 10] = ids[0, 10]  # exactly one scored token
    setattr(ours, NUM_CHUNKS_ATTR, 1000)  # one token per chunk: the chunk count is the number of scored positions
    o1 = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    o2 = theirs(input_ids=ids, labels=labels, fused_lm_head=True)
    assert LeanLogProbFunction.last_forward_chunks == 1 and int(o1.label_mask.sum()) == 1  # prompt/padding unscored
    assert _close(o1.log_probs, o2.log_probs) and _close(o1.entropy, o2.entropy)


def test_shift_labels_and_num_items_in_batch():
    ours, theirs = _pair()
    ids, labels = _batch(4)
    shift = torch.cat([labels[:, 1:], torch.full((labels.shape[0], 1), -100)], 1)
    o1 = ours(input_ids=ids, shift_labels=shift, fused_lm_head=True, num_items_in_batch=13)
    o2 = theirs(input_ids=ids, shift_labels=shift, fused_lm_head=True, num_items_in_batch=13)
    assert o1.log_probs.shape == ids.shape
    assert _close(o1.loss, o2.loss) and _close(o1.log_probs, o2.log_probs)
    unshifted = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    assert _close(o1.log_probs[:, :-1], unshifted.log_probs)


@pytest.mark.parametrize("config", [{"final_logit_softcapping": 2.5}, {"logit_scale": 0.5},
                                    {"final_logit_softcapping": 4.0, "logits_scaling": 2.0}])
def test_softcap_and_logit_scale_configs(config):
    ours, theirs = _pair(outputs=("log_probs", "entropy"), temperature=0.8, **config)
    ref_model = copy.deepcopy(theirs)
    scale = config.get("logit_scale", 1 / config.get("logits_scaling", 1.0))
    ids, labels = _batch(5)
    o1 = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    o2 = theirs(input_ids=ids, labels=labels, fused_lm_head=True)
    ref = _naive(ref_model, ids, labels, 0.8, config.get("final_logit_softcapping"), scale)
    for field in ("log_probs", "entropy"):
        assert _close(getattr(o1, field), getattr(o2, field)) and _close(getattr(o1, field), ref[field]), field
    (o1.log_probs.sum() + o1.entropy.sum()).backward()
    (ref["log_probs"].sum() + ref["entropy"].sum()).backward()
    g1, g3 = _grads(ours), _grads(ref_model)
    for name in g3:
        assert (g1[name] - g3[name]).abs().max() / g3[name].abs().max().clamp(min=1e-8) < 1e-5, name


def test_bf16_model_within_tolerance():
    ours, theirs = _pair(outputs=("log_probs", "entropy"))
    ours.to(torch.bfloat16)
    ref_model = copy.deepcopy(theirs)
    ids, labels = _batch(6)
    out = ours(input_ids=ids, labels=labels, fused_lm_head=True)
    ref = _naive(ref_model, ids, labels)
    assert out.log_probs.dtype == torch.float32  # the fold is fp32 like TRL's
    assert torch.allclose(out.log_probs, ref["log_probs"], atol=0.1, rtol=0.02)
    assert torch.allclose(out.entropy, ref["entropy"], atol=0.1, rtol=0.02)
    out.loss.backward()
    assert ours.lm_head.weight.grad.dtype == torch.bfloat16 and torch.isfinite(ours.lm_head.weight.grad).all()


def test_bf16_autocast_matches_trl():
    ours, theirs = _pair(outputs=("log_probs", "entropy"))
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
