"""Shared-prefix forwards (slimrl_shared_prefix) in the patched GRPO/RLOO trainers: parity with stock TRL, the path
really taken (positions counted), fallbacks with their reason logged once, the config field.

Parity cases force `slimrl_shared_prefix=True` on the patched side only; stock TRL runs its per-row forward. They
cover every GRPO loss type, token and sequence importance sampling, beta 0 and > 0 (adapter-disabled, "ref" adapter
and reloaded reference), num_iterations 2 (old-policy forward), gradient accumulation with shuffled micro-batches,
gradient checkpointing True / "offload", slimrl_num_chunks, and RLOO.
"""

import logging

import pytest

try:
    from . import _parity as P
except ImportError:  # tests/patches is not a package
    import _parity as P

from slimrl.patches import shared_prefix as SP

SHARE = {SP.CONFIG_FIELD: True}


def _factory(kind, saved_model):
    if kind == "saved":
        return lambda: P.load_tiny(saved_model)
    if kind == "peft_model":
        def make():
            from peft import get_peft_model

            model = P.tiny_model(0)
            P.torch.manual_seed(7)
            return get_peft_model(model, P.lora_config())
        return make
    return lambda: P.tiny_model(0)


# Sharing changes float32 rounding (other shapes, other summation orders); where a quantity is ill-conditioned the
# two float32 results land further apart than the suite's 1e-5, each as close to a float64 run of stock TRL as the
# other. Measured against that float64 run (per-token log-probs: stock 4e-8, shared 5e-8 in both cases):
#   vespo: second-step loss (cancels most of its terms) error 1.8e-6 stock, 4.4e-6 shared -> 2e-5 apart;
#   lora-beta0-ga2-entropybonus: last micro-step gradient error 1.15e-5 stock, 2.5e-6 shared -> 1.3e-5 apart.
# The packing itself is exact to 1e-12 in float64 (tests/ops/test_shared_prefix_op.py).
RTOL = {"vespo": 3e-5, "lora-beta0-ga2-entropybonus": 3e-5}


def _run(algorithm, tmp_path, kind, saved_model, config, lora, chunks=None, checkpointing=None, rtol=P.RTOL):
    stock, patched = P.build_pair(algorithm, _factory(kind, saved_model), config, str(tmp_path),
                                  peft_config=P.lora_config() if lora else None, num_chunks=chunks,
                                  patched_config=SHARE)
    if checkpointing is not None:  # transformers' own checkpointing on the stock side, slimrl's mode on the patched one
        from slimrl.models.checkpointing import (
            apply_checkpointing,
            is_checkpointing_active,
        )

        stock.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        apply_checkpointing(patched.model, checkpointing)
        assert is_checkpointing_active(stock.model) and is_checkpointing_active(patched.model)
    traces = P.run_pair(algorithm, stock, patched)
    P.assert_traces_match(*traces, rtol=rtol)
    stats = SP.shared_prefix_stats(patched)
    assert stats.shared_calls > 0, f"the shared-prefix path was not taken: {stats}"
    assert stats.positions_forwarded < stats.positions_per_row_path, stats
    assert not SP.shared_prefix_stats(stock).shared_calls
    return stock, patched, traces, stats


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_types_shared(tmp_path, unpatched, saved_model, loss_type):
    level = "sequence" if loss_type in ("luspo", "grpo") else "token"  # LUSPO requires it; GRPO covers GSPO
    config = dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, num_iterations=2,
                  per_device_train_batch_size=4, num_generations=2, max_completion_length=7)
    stock, _, (s, _), stats = _run("grpo", tmp_path, "memory", saved_model, config, lora=True, chunks=3,
                                   rtol=RTOL.get(loss_type, P.RTOL))
    assert all("old_per_token_logps" in x and "ref_per_token_logps" in x for x in s.inputs)
    assert max(stock._metrics["train"]["kl"]) > 0
    assert stats.shared_calls >= 4 and not stats.fallback_calls  # policy x2, old-policy, reference


TARGETED = {
    # full fine-tuning, reference reloaded from disk, old log-probs (steps_per_generation 2 > accumulation 1):
    # micro-batches of 3 drawn from a shuffled 2 x 3 generation batch
    "full-ref-spg2": ("saved", False, None, None, dict(
        loss_type="dapo", beta=0.04, steps_per_generation=2, per_device_train_batch_size=3, num_generations=3,
        max_completion_length=7)),
    # no reference, accumulation with shuffled micro-batches, entropy bonus (gradient through entropies)
    "lora-beta0-ga2-entropybonus": ("memory", True, -1, None, dict(
        loss_type="dr_grpo", beta=0.0, entropy_coef=0.01, gradient_accumulation_steps=2, num_iterations=2,
        per_device_train_batch_size=3, num_generations=3, max_completion_length=5)),
    # user-wrapped PeftModel (frozen "ref" adapter), checkpointing on
    "peftmodel-refadapter-checkpointing": ("peft_model", False, 1, True, dict(
        loss_type="bnpo", beta=0.04, gradient_checkpointing=True, num_iterations=2, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6)),
    # full fine-tuning with offloaded checkpointing, sequence ratios, truncated completions masked
    "full-offload-seq-masktrunc": ("memory", False, 3, "offload", dict(
        loss_type="grpo", importance_sampling_level="sequence", beta=0.0, num_iterations=2, gradient_checkpointing=True,
        mask_truncated_completions=True, per_device_train_batch_size=6, num_generations=3, max_completion_length=6)),
}


@pytest.mark.parametrize("case", list(TARGETED))
def test_grpo_targeted_shared(tmp_path, unpatched, saved_model, case):
    kind, lora, chunks, checkpointing, config = TARGETED[case]
    _run("grpo", tmp_path, kind, saved_model, config, lora, chunks, checkpointing, rtol=RTOL.get(case, P.RTOL))


RLOO_CASES = {
    "lora-default-beta": ("memory", True, dict(per_device_train_batch_size=4, num_generations=2)),
    "full-ref-iters2-ga2": ("saved", False, dict(num_iterations=2, gradient_accumulation_steps=2,
                                                 per_device_train_batch_size=3, num_generations=3)),
}


@pytest.mark.parametrize("case", list(RLOO_CASES))
def test_rloo_shared(tmp_path, unpatched, saved_model, case):
    kind, lora, config = RLOO_CASES[case]
    _run("rloo", tmp_path, kind, saved_model, config, lora)


def test_broken_sharing_fails_parity(tmp_path, unpatched, saved_model, monkeypatch):
    """Negative control: completions that can see their siblings must fail the stock comparison."""
    from slimrl.ops import shared_prefix as op

    real = op.attention_mask_4d

    def leaky(packed, attn, dtype):
        seg = packed.segment
        return real(packed, attn, dtype) | ((seg[:, None, :] > 0) & (seg[:, :, None] > 0))[:, None]

    monkeypatch.setattr(op, "attention_mask_4d", leaky)
    with pytest.raises(AssertionError):
        _run("grpo", tmp_path, "memory", saved_model, dict(beta=0.0, num_iterations=2), lora=True)


def _patched_trainer(tmp_path, setting=True, **config):
    with P.patched_state("grpo"):
        args = P.make_config("grpo", str(tmp_path), **{SP.CONFIG_FIELD: setting}, **config)
        return P.build_trainer("grpo", P.tiny_model(0), args, P.lora_config())


def _rows(prompts, completion_len=5, seed=0):
    g = P.torch.Generator().manual_seed(seed)
    width = max(len(p) for p in prompts)
    ids = P.torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (P.torch.arange(width)[None] >= P.torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    completions = P.torch.randint(3, P.VOCAB, (len(prompts), completion_len), generator=g)
    return P.torch.cat([ids, completions], 1), P.torch.cat([mask, P.torch.ones_like(completions)], 1)


def test_direct_calls_chunks_and_no_repeat_fallback(tmp_path, unpatched, caplog):
    """The seam called as TRL calls it: row chunks (`batch_size`) are shared inside each chunk; rows with no repeated
    prompt fall back with one logged reason; values equal TRL's own function."""
    trainer = _patched_trainer(tmp_path)
    original = type(trainer)._get_per_token_logps_and_entropies
    with P.patched_state("grpo"):
        patched = type(trainer)._get_per_token_logps_and_entropies
        assert patched.__slimrl_original__ is original
        a, b = [5, 6, 7, 8, 9, 10], [11, 12, 13]
        ids, mask = _rows([a, a, b, a, b, b])
        with caplog.at_level(logging.INFO, logger="slimrl"), P.torch.no_grad():
            got = patched(trainer, trainer.model, ids, mask, 5, batch_size=3, compute_entropy=True)
            want = original(trainer, trainer.model, ids, mask, 5, batch_size=3, compute_entropy=True)
            stats = SP.shared_prefix_stats(trainer)
            assert stats.shared_calls == 2 and got[2] is None
            for x, y in zip(got[:2], want[:2]):
                P.assert_close_rel(x, y, "chunked shared vs TRL")
            distinct, distinct_mask = _rows([a, b, [4, 5]])
            for _ in range(3):
                got = patched(trainer, trainer.model, distinct, distinct_mask, 5)
            P.assert_close_rel(got[0], original(trainer, trainer.model, distinct, distinct_mask, 5)[0], "fallback")
    reason = "no prompt is repeated among the rows of a forward"
    assert stats.reasons[reason] == 3
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


def test_model_problems_name_the_reason():
    from transformers import AutoConfig, AutoModelForCausalLM

    llama = P.tiny_model(0)
    assert SP.model_problem(llama, {}, 50, True) is None
    assert "multimodal" in SP.model_problem(llama, {"pixel_values": P.torch.zeros(1)}, 50, True)
    assert "aux loss" in SP.model_problem(llama, {"compute_aux_loss": True}, 50, True)
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=1,
                                                                 n_head=2))
    assert "not verified" in SP.model_problem(gpt2, {}, 50, True)
    mistral = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "mistral", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, sliding_window=32))
    assert SP.model_problem(mistral, {}, 32, True) is None
    assert "sliding window" in SP.model_problem(mistral, {}, 33, True)
    llama.config._attn_implementation = "flash_attention_2"
    assert "attention implementation" in SP.model_problem(llama, {}, 50, True)
    dropout = P.tiny_llama(attention_dropout=0.1).train()
    assert SP.model_problem(dropout, {}, 50, True) is None
    assert "dropout" in SP.model_problem(dropout, {}, 50, SP.AUTO)
    assert SP.model_problem(dropout.eval(), {}, 50, SP.AUTO) is None


def test_auto_falls_back_under_dropout_and_matches_stock(tmp_path, unpatched, caplog):
    """'auto' with active dropout: TRL's path (same numbers as stock), the reason logged once."""
    def factory():
        model = P.tiny_llama(seed=0, vocab_size=P.VOCAB, hidden_size=P.HIDDEN, num_layers=P.LAYERS,
                             attention_dropout=0.3)
        with P.torch.no_grad():
            model.lm_head.weight[P.EOS_ID] *= P.EOS_BOOST
        return model

    with caplog.at_level(logging.INFO, logger="slimrl"):
        stock, patched = P.build_pair("grpo", factory, dict(beta=0.0, disable_dropout=False, num_iterations=2),
                                      str(tmp_path))
        P.assert_traces_match(*P.run_pair("grpo", stock, patched))
    stats = SP.shared_prefix_stats(patched)
    assert stats.shared_calls == 0 and stats.fallback_calls >= 3
    assert sum("dropout is active" in r.getMessage() for r in caplog.records) == 1


def test_config_field(tmp_path, unpatched):
    with P.patched_state("grpo"):
        assert P.make_config("grpo", str(tmp_path)).slimrl_shared_prefix == SP.AUTO
        with pytest.raises(ValueError, match="slimrl_shared_prefix"):
            P.make_config("grpo", str(tmp_path), slimrl_shared_prefix="yes")
    with P.patched_state("rloo"):
        assert P.make_config("rloo", str(tmp_path), slimrl_shared_prefix=False).slimrl_shared_prefix is False
    trainer = _patched_trainer(tmp_path, setting=False, beta=0.0)
    ids, mask = _rows([[5, 6, 7]] * 4)
    with P.patched_state("grpo"), P.torch.no_grad():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 5)
    assert SP.shared_prefix_stats(trainer) == SP.SharedPrefixStats()


def test_auto_rule():
    """'auto' shares when prompts are long next to completions, not when completions dominate the rows, nor when
    the forward is tiny."""
    config = P.tiny_llama(hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536, num_layers=30).config
    # 8 completions of 16 tokens after a 150-token prompt (the slimrl grpo recipe): packed 149 + 8 x 16 positions
    assert SP.estimated_cost_ratio(config, 8, 166, 1, 149 + 8 * 16) < 0.3
    assert SP.auto_refusal(config, 8, 166, 1, 149 + 8 * 16) is None
    # 8 completions of 1024 tokens after a 16-token prompt: the dense packed row costs more than it saves
    assert "ratio" in SP.auto_refusal(config, 8, 1040, 1, 15 + 8 * 1024)
    tiny = P.tiny_model(0).config  # the parity suites' model: 2 x 32
    assert "FLOPs" in SP.auto_refusal(tiny, 4, 15, 2, 12)
