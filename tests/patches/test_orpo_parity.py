"""Patched ORPOTrainer ≡ stock TRL 1.16 experimental ORPOTrainer (loss, gradients, every logged metric), without
ever holding [2B, T, V] logits; fallbacks; the `from trl import ORPOTrainer` alias.

Cases: full fine-tuning and LoRA on a tiny Llama, tied embeddings with gradient accumulation, a Gemma2 with a
final-logit softcap (the softcap changes every number), all over 2 optimizer steps with prompts / chosen / rejected
of different lengths and batches of 3 or 2 pairs. Negative control: a different beta must fail the comparison.
"""

import types

import pytest

import _orpo_cpo_parity as H
import _parity as P
import _tiny as T
import torch

ALGO = "orpo"


def _tied_llama():
    return T.tiny_model(0, tie_word_embeddings=True)


def _gemma2_softcap():
    from transformers import AutoModelForCausalLM, Gemma2Config

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=T.VOCAB, hidden_size=T.HIDDEN, intermediate_size=2 * T.HIDDEN,
                          num_hidden_layers=T.LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          final_logit_softcapping=0.5, pad_token_id=0, eos_token_id=2, bos_token_id=None,
                          attn_implementation="eager")
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


CASES = {
    "full-bs3": (lambda: T.tiny_model(0), False, {}),
    "lora-bs3-beta-checkpointing": (lambda: T.tiny_model(0), True, dict(beta=0.3, gradient_checkpointing=True)),
    "full-tied-ga2-bs2": (_tied_llama, False, dict(gradient_accumulation_steps=2, per_device_train_batch_size=2)),
    "gemma2-softcap": (_gemma2_softcap, False, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_orpo_parity(tmp_path, unpatched, case):
    factory, lora, config = CASES[case]
    traces = H.run_sides(ALGO, H.build_sides(ALGO, factory, config, str(tmp_path), H.lora_config() if lora else None))
    H.assert_traces_match(traces)
    s = traces.stock
    assert {"nll_loss", "log_odds_ratio", "logits/chosen", "logits/rejected", "logps/chosen"} <= set(s.metrics)
    assert s.losses[0] != s.losses[-1], "the SGD step should move the loss"


def _peak_numel(trainer, batch) -> int:
    """Elements of the largest storage any op allocates (forward and backward) during one training_step.

    Views and in-place / `out=` results share an input's storage and are not allocations: skipped.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def storages(tree):
        return {t.untyped_storage().data_ptr() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = storages((args, kwargs))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
            return out

    with Largest() as mode:
        trainer.training_step(trainer.model, batch)
    return mode.largest


def test_patched_step_never_allocates_full_logits(tmp_path, unpatched):
    from slimrl.ops.lean_logprob import LeanLogProbFunction

    vocab = 4096  # 2B*T*V dwarfs every weight (V*H = 131k elements)

    def factory():
        return T.tiny_llama(seed=0, vocab_size=vocab, hidden_size=T.HIDDEN, num_layers=T.LAYERS)

    with P.stock_state():
        stock = H.build_trainer(ALGO, factory(), H.make_config(ALGO, str(tmp_path)), H.lora_config())
    with P.patched_state(ALGO):  # the config knob (preference_common's set-up patches) reaches the lean head
        patched = H.build_trainer(ALGO, factory(), H.make_config(ALGO, str(tmp_path), slimrl_num_chunks=8),
                                  H.lora_config())
    batch = next(iter(stock.get_train_dataloader()))
    rows = 2 * batch["chosen_input_ids"].shape[0]
    seq = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
    full_logits = rows * seq * vocab
    with P.stock_state():
        stock_peak = _peak_numel(stock, batch)
    with P.patched_state(ALGO):
        patched_peak = _peak_numel(patched, batch)
    assert stock_peak >= full_logits, "negative control: stock holds [2B, T, V] logits"
    assert LeanLogProbFunction.last_forward_chunks == LeanLogProbFunction.last_backward_chunks == 8
    assert patched_peak <= full_logits / 4, f"patched allocated {patched_peak} elements ({full_logits} = 2B*T*V)"


def test_lora_on_lm_head_falls_back_to_stock_with_warning(tmp_path, unpatched):
    lora = H.lora_config(target_modules=["q_proj", "lm_head"])
    trainers = H.build_sides(ALGO, lambda: T.tiny_model(0), {}, str(tmp_path), lora)
    with pytest.warns(UserWarning, match=r"ORPOTrainer.concatenated_forward runs stock.*not a plain torch.nn.Linear"):
        traces = H.run_sides(ALGO, trainers, optimizer_steps=1)
    H.assert_traces_match(traces)
    s = traces.stock
    assert any("lm_head" in name for name in s.grads[0])


def test_encoder_decoder_calls_stock_with_warning(unpatched):
    from slimrl.patches.orpo import make_concatenated_forward

    calls = []

    def original(self, model, batch):
        calls.append((self, model, batch))
        return "stock-result"

    trainer = types.SimpleNamespace(is_encoder_decoder=True)
    with pytest.warns(UserWarning, match="encoder-decoder"):
        assert make_concatenated_forward(original)(trainer, "model", "batch") == "stock-result"
    assert calls == [(trainer, "model", "batch")]


def test_unreproduced_logit_postprocessing_raises(tmp_path, unpatched):
    def factory():  # Llama ignores this field; slimrl would softcap: the probe check must catch the mismatch
        model = T.tiny_model(0)
        model.config.final_logit_softcapping = 1.0
        return model

    with P.patched_state(ALGO):
        trainer = H.build_trainer(ALGO, factory(), H.make_config(ALGO, str(tmp_path)))
        batch = next(iter(trainer.get_train_dataloader()))
        with pytest.raises(RuntimeError, match=r"post-processes its lm_head output.*softcap=1.0"):
            trainer.training_step(trainer.model, batch)


def test_from_trl_import_alias_appears_with_patch_and_goes_with_unpatch(unpatched):
    import trl
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    from slimrl.patches import registry

    names = ("ORPOConfig", "ORPOTrainer", "CPOConfig", "CPOTrainer")
    with pytest.raises(ImportError):
        from trl import ORPOTrainer as _  # noqa: F401
    registry.PatchFastRL("orpo")
    from trl import ORPOConfig as aliased_config, ORPOTrainer as aliased_trainer

    assert (aliased_config, aliased_trainer) == (ORPOConfig, ORPOTrainer)
    assert not hasattr(trl, "CPOTrainer"), "only the patched algorithm's aliases"
    registry.PatchFastRL("cpo")
    from trl import CPOConfig as cpo_config, CPOTrainer as cpo_trainer

    assert (cpo_config, cpo_trainer) == (CPOConfig, CPOTrainer)
    registry.unpatch("orpo")
    assert not hasattr(trl, "ORPOTrainer") and trl.CPOTrainer is CPOTrainer
    registry.unpatch()
    assert not any(name in vars(trl) for name in names)
    assert not hasattr(ORPOTrainer, "__slimrl_original__"), "the aliased class itself must stay untouched"


def test_alias_leaves_a_trl_symbol_alone(monkeypatch, unpatched):
    import trl

    from slimrl.patches import registry

    sentinel = object()
    monkeypatch.setattr(trl, "ORPOTrainer", sentinel, raising=False)
    registry.PatchFastRL("orpo")
    assert trl.ORPOTrainer is sentinel and "trl.ORPOTrainer" not in registry.applied_seams()
    registry.unpatch()
    assert trl.ORPOTrainer is sentinel


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
    stats = preference_stats(h, w, b, labels, num_chosen=B, average_log_prob=average, nll_labels=nll_labels,
                             logits_drop_last=drop_last, softcap=softcap, logit_scale=scale, num_chunks=3)
    grads = torch.autograd.grad((stats.logps * coef).sum() + 3 * stats.chosen_nll, (h, w, b))
    ours = (stats.logps, stats.chosen_nll, stats.chosen_mean_logits, stats.rejected_mean_logits, *grads)
    names = ("logps", "chosen_nll", "chosen_mean_logits", "rejected_mean_logits", "grad hidden", "grad weight",
             "grad bias")
    for name, p, s, r in zip(names, ours, naive(torch.float32), naive(torch.float64)):
        P.check(f"op: {name}", p.detach(), s.detach(), r.detach())
    assert torch.equal(stats.token_counts, (labels[:, 1:] != -100).sum(-1))
