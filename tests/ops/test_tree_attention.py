"""slimrl.ops.tree_attention: AsyncGRPO's packed prefix-trie row forwards as its samples forward one by one.

TRL's `TreeRow` packs samples that share prefixes (the completions of a prompt, a conversation after a fork) into one
row whose segments attend along their root-to-segment paths. Through slimrl's tree attention, the log-probability
of every trained token (`token_index` of the packed row) equals the one the sample's own plain forward gives: exactly
in float64 (1e-12), in float32 by the parity rule (tests/patches/_parity.py) against the float64 per-sample forward.
GQA, a sliding window shorter than the rows, and negative controls (a segment that also sees a sibling, a window
ignored) are covered.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface

from slimrl.ops import tree_attention as ta

import _parity as P

NAME = "slimrl_tree_test"
V = 97


@pytest.fixture(autouse=True, scope="module")
def _registered():
    AttentionInterface.register(NAME, ta.tree_attention)
    AttentionMaskInterface.register(NAME, lambda **kwargs: None)


def _model(model_type="llama", dtype=torch.float64, **config):
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        **config,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dtype).eval()


def _samples():
    """Two prompts; completions of one prompt share it, two of them share a first turn too (a fork), one is alone."""
    rng = np.random.default_rng(0)
    prompt_a, prompt_b = list(rng.integers(3, V, 9)), list(rng.integers(3, V, 6))
    turn = list(rng.integers(3, V, 4))
    bodies = [
        (prompt_a, turn + list(rng.integers(3, V, 5))),
        (prompt_a, turn + list(rng.integers(3, V, 3))),
        (prompt_a, list(rng.integers(3, V, 7))),
        (prompt_b, list(rng.integers(3, V, 6))),
    ]
    samples = []
    for group, (prompt, completion) in enumerate(bodies):
        ids = np.array(prompt + completion)
        mask = np.array([0] * len(prompt) + [1] * len(completion))
        mask[len(prompt) + 1] = 0  # a context token inside a completion (a tool result)
        samples.append(
            {
                "input_ids": torch.tensor(ids),
                "completion_mask": torch.tensor(mask),
                "old_log_probs": torch.zeros(len(ids)),
                "advantage": 1.0,
                "group_id": group // 3,
            }
        )
    return samples


def _packed(samples):
    from trl.experimental.async_grpo.packing import TreeRow

    row = TreeRow()
    for sample in samples:
        row.add(sample)
    return row.pack()


def _packed_logprobs(model, packed, **attention_kwargs):
    model.set_attn_implementation(NAME)
    out = model(
        input_ids=packed["input_ids"][None],
        position_ids=packed["position_ids"][None],
        tree_kv_index=packed["tree_kv_index"],
        tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
        tree_cu_seqlens_k=packed["tree_cu_seqlens_k"],
        **attention_kwargs,
    )
    logp = out.logits[0].double().log_softmax(-1)
    labels = packed["shift_labels"]
    index = packed["token_index"]
    return logp[index, labels[index]]


def _per_sample_logprobs(model, samples):
    model.set_attn_implementation("sdpa")
    values = []
    for sample in samples:
        ids = sample["input_ids"]
        logp = model(input_ids=ids[None]).logits[0].double().log_softmax(-1)
        trained = torch.nonzero(sample["completion_mask"][1:]).flatten() + 1
        values.append(logp[trained - 1, ids[trained]])
    return torch.cat(values)


def test_the_row_shares_prefixes():
    samples = _samples()
    packed = _packed(samples)
    assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)
    assert len(packed["tree_cu_seqlens_q"]) - 1 > len(samples)  # segments: shared prefixes and branches


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_float64_exact(model_type):
    model, samples = _model(model_type), _samples()
    with torch.no_grad():
        packed = _packed_logprobs(model, _packed(samples))
        per_sample = _per_sample_logprobs(model, samples)
    torch.testing.assert_close(packed, per_sample, rtol=0, atol=1e-12)


def test_float32_by_the_parity_rule():
    samples = _samples()
    reference = _per_sample_logprobs(_model(), samples).detach()
    model32 = _model(dtype=torch.float32)
    with torch.no_grad():
        packed = _packed_logprobs(model32, _packed(samples))
        per_sample = _per_sample_logprobs(model32, samples)
    P.check("tree attention log-probs", packed, per_sample, reference)


def test_sliding_window_shorter_than_the_rows():
    """Mistral's attention passes `config.sliding_window` to the attention function."""
    model, samples = _model("mistral", sliding_window=5), _samples()
    packed = _packed(samples)
    with torch.no_grad():
        windowed = _packed_logprobs(model, packed)
        per_sample = _per_sample_logprobs(model, samples)
        model.config.sliding_window = None  # the same weights, no window
        ignored = _packed_logprobs(model, packed)
    torch.testing.assert_close(windowed, per_sample, rtol=0, atol=1e-12)
    assert (ignored - per_sample).abs().max() > 1e-3, "negative control: the window must matter here"


def test_negative_control_a_segment_that_sees_a_sibling(monkeypatch):
    model, samples = _model(), _samples()
    packed = _packed(samples)
    real = ta.tree_mask

    def leaky(num_tokens, *args, **kwargs):
        mask = real(num_tokens, *args, **kwargs)
        return mask | torch.ones_like(mask).tril()  # every earlier packed token, siblings' branches included

    monkeypatch.setattr(ta, "tree_mask", leaky)
    with torch.no_grad():
        wrong = _packed_logprobs(model, packed)
        per_sample = _per_sample_logprobs(model, samples)
    assert (wrong - per_sample).abs().max() > 1e-3


def test_softcap_is_refused_naming_it():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="softcap=30"):
        ta.tree_attention(
            None,
            q,
            q,
            q,
            None,
            tree_kv_index=torch.arange(3),
            tree_cu_seqlens_q=torch.tensor([0, 3]),
            tree_cu_seqlens_k=torch.tensor([0, 3]),
            softcap=30.0,
        )
