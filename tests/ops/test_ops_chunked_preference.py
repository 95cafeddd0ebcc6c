"""slimrl.ops.chunked_preference (the lean forward of ORPO/CPO) alone, against naive full logits: stock's
arithmetic is the naive computation in float32, the reference the same in float64 (tests/patches/_parity.py's rule).
The trainer-level comparisons are in tests/patches/trainers/test_orpo_parity.py and test_cpo_parity.py.
"""

import pytest
import torch

import _parity as P


@pytest.mark.parametrize("average, drop_last", [(True, True), (False, False)])
def test_preference_stats_match_full_logits_reference(average, drop_last):
    """The op alone vs naive full logits, with softcap, logit scale, bias, 3 chunks, and NLL targets that differ
    from the labels at some positions (TRL's collator never produces that; the op scores them separately).
    Stock's arithmetic is the naive computation in float32; the reference is the same in float64 (_parity's rule)."""
    from slimrl.ops.chunked_preference import preference_stats

    gen = torch.Generator().manual_seed(0)
    R, L, H, V, B, softcap, scale = 6, 9, 8, 50, 3, 2.0, 0.7
    hidden = torch.randn(R, L, H, generator=gen)
    weight = torch.randn(V, H, generator=gen).mul_(0.5)
    bias = torch.randn(V, generator=gen)
    ids = torch.randint(0, V, (R, L), generator=gen)
    labels = ids.masked_fill(torch.rand(R, L, generator=gen) < 0.4, -100)
    labels[:, :2] = -100  # prompt
    nll_labels = torch.where(torch.rand(R, L, generator=gen) < 0.3, torch.randint(0, V, (R, L), generator=gen), ids)
    nll_labels[:, -1] = -100  # padding
    coef = torch.linspace(-1, 2, R)

    def naive(dtype):
        h, w, b = (x.to(dtype).requires_grad_() for x in (hidden, weight, bias))
        z = torch.tanh((h @ w.T + b) * scale / softcap) * softcap
        logp = z[:, :-1].log_softmax(-1)
        tgt, mask = labels[:, 1:], labels[:, 1:] != -100
        logps = (logp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1)
        logps = logps / mask.sum(-1) if average else logps
        nll = torch.nn.functional.cross_entropy(z[:B, :-1].reshape(-1, V), nll_labels[:B, 1:].reshape(-1))
        zm = (z[:, :-1] if drop_last else z).detach()
        grads = torch.autograd.grad((logps * coef).sum() + 3 * nll, (h, w, b))
        return (logps, nll, zm[:B].mean(), zm[B:].mean(), *grads)

    h, w, b = (x.clone().requires_grad_() for x in (hidden, weight, bias))
    stats = preference_stats(
        h,
        w,
        b,
        labels,
        num_chosen=B,
        average_log_prob=average,
        nll_labels=nll_labels,
        logits_drop_last=drop_last,
        softcap=softcap,
        logit_scale=scale,
        num_chunks=3,
    )
    grads = torch.autograd.grad((stats.logps * coef).sum() + 3 * stats.chosen_nll, (h, w, b))
    ours = (stats.logps, stats.chosen_nll, stats.chosen_mean_logits, stats.rejected_mean_logits, *grads)
    names = (
        "logps",
        "chosen_nll",
        "chosen_mean_logits",
        "rejected_mean_logits",
        "grad hidden",
        "grad weight",
        "grad bias",
    )
    for name, p, s, r in zip(names, ours, naive(torch.float32), naive(torch.float64)):
        P.check(f"op: {name}", p.detach(), s.detach(), r.detach())
    assert torch.equal(stats.token_counts, (labels[:, 1:] != -100).sum(-1))


def _graph_reaches(tensor, params) -> set:
    """The parameters whose AccumulateGrad node the autograd graph of `tensor` reaches (what DDP's unused-parameter
    search walks, from the forward's outputs)."""
    wanted, found, seen, stack = {id(p): p for p in params}, set(), set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in wanted:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def test_forward_outputs_reach_the_weights_the_statistics_use():
    """DDP(find_unused_parameters=True) marks as unused every parameter the forward's outputs do not reach; the lean
    head's statistics leave through its box, so the returned logits must carry them (GraphCarrier)."""
    from peft import LoraConfig, get_peft_model

    from slimrl.ops.chunked_preference import lean_head_or_reason, lean_policy_forward
    from slimrl.testing import tiny_llama

    model = get_peft_model(
        tiny_llama(vocab_size=128, hidden_size=16, num_layers=1),
        LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False),
    )
    lm_head, causal_lm = lean_head_or_reason(model)
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    outputs, stats = lean_policy_forward(
        model, lm_head, causal_lm, ids, torch.ones_like(ids), {}, labels=ids, num_chosen=1, average_log_prob=True
    )
    lora = [p for n, p in model.named_parameters() if p.requires_grad]
    assert lora and _graph_reaches(stats.logps, lora) == {id(p) for p in lora}
    assert _graph_reaches(outputs.logits, lora) == {id(p) for p in lora}, "DDP would mark the LoRA weights unused"
