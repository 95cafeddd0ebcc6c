"""Patched ORPOTrainer ≡ stock TRL 1.16 experimental ORPOTrainer (loss, gradients, every logged metric), without
ever holding [2B, T, V] logits; fallbacks; the `from trl import ORPOTrainer` alias.

Cases: full fine-tuning and LoRA on a tiny Llama, tied embeddings with gradient accumulation, a Gemma2 with a
final-logit softcap (the softcap changes every number), all over 2 optimizer steps with prompts / chosen / rejected
of different lengths and batches of 3 or 2 pairs. Negative control: a different beta must fail the comparison.
"""

import types

import pytest
import torch

import _harness as HS
import _orpo_cpo_parity as H
import _parity as P
import _tiny as T

ALGO = "orpo"


def _tied_llama():
    return T.tiny_model(0, tie_word_embeddings=True)


def _gemma2_softcap():
    from transformers import AutoModelForCausalLM, Gemma2Config

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=T.VOCAB,
        hidden_size=T.HIDDEN,
        intermediate_size=2 * T.HIDDEN,
        num_hidden_layers=T.LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=0.5,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        attn_implementation="eager",
    )
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
    """Elements of the largest storage any op allocates (forward and backward) during one training_step."""
    return HS.largest_allocation(lambda: trainer.training_step(trainer.model, batch))


def test_patched_step_never_allocates_full_logits(tmp_path, unpatched):
    from slimrl.ops.lean_logprob import LeanLogProbFunction

    vocab = 4096  # 2B*T*V dwarfs every weight (V*H = 131k elements)

    def factory():
        return T.tiny_llama(seed=0, vocab_size=vocab, hidden_size=T.HIDDEN, num_layers=T.LAYERS)

    with P.stock_state():
        stock = H.build_trainer(ALGO, factory(), H.make_config(ALGO, str(tmp_path)), H.lora_config())
    with P.patched_state(
        ALGO
    ):  # the config knob (the shared set-up, patches/setup/trainer_setup.py) reaches the lean head
        patched = H.build_trainer(
            ALGO, factory(), H.make_config(ALGO, str(tmp_path), slimrl_num_chunks=8), H.lora_config()
        )
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
    # 8 chunks of the 76 scored positions: one chunk's fp32 logits, 10 x V = 1/12 of 2B x T x V
    assert patched_peak * 12 <= full_logits, f"patched allocated {patched_peak} elements ({full_logits} = 2B*T*V)"


def test_lora_on_lm_head_falls_back_to_stock_with_warning(tmp_path, unpatched):
    # gate_proj too: with adapters on q_proj and lm_head only, the nearest trained weights sit a layer away from the
    # MLP weight scripts/parity_floor.py changes, and a change of 1.7e-5 was needed to fail (1e-5 elsewhere)
    lora = H.lora_config(target_modules=["q_proj", "gate_proj", "lm_head"])
    trainers = H.build_sides(ALGO, lambda: T.tiny_model(0), {}, str(tmp_path), lora)
    with pytest.warns(UserWarning, match=r"ORPOTrainer.concatenated_forward runs stock.*not a plain torch.nn.Linear"):
        traces = H.run_sides(ALGO, trainers, optimizer_steps=1)
    H.assert_traces_match(traces)
    s = traces.stock
    assert any("lm_head" in name for name in s.grads[0])


def test_encoder_decoder_calls_stock_with_warning(unpatched):
    from slimrl.patches.scoring.concatenated_forward import concatenated_forward_maker
    from slimrl.patches.scoring.shared_prefix import shared_prefix_stats
    from slimrl.patches.trainers.orpo import ORPO

    calls = []

    def original(self, model, batch):
        calls.append((self, model, batch))
        return "stock-result"

    trainer = types.SimpleNamespace(is_encoder_decoder=True, args=types.SimpleNamespace(slimrl_shared_prefix="auto"))
    with pytest.warns(UserWarning, match="encoder-decoder"):
        assert concatenated_forward_maker(ORPO)(original)(trainer, "model", "batch") == "stock-result"
    assert calls == [(trainer, "model", "batch")]
    stats = shared_prefix_stats(trainer)  # no shared prefix either, and the reason is recorded
    assert stats.fallback_calls == 1 and list(stats.reasons) == [
        "stock's full-logits forward runs: the model is an encoder-decoder"
    ]


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
    from trl import ORPOConfig as aliased_config
    from trl import ORPOTrainer as aliased_trainer

    assert (aliased_config, aliased_trainer) == (ORPOConfig, ORPOTrainer)
    assert not hasattr(trl, "CPOTrainer"), "only the patched algorithm's aliases"
    registry.PatchFastRL("cpo")
    from trl import CPOConfig as cpo_config
    from trl import CPOTrainer as cpo_trainer

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
