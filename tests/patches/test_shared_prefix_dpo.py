"""Shared-prefix forwards in the patched DPOTrainer: the prompt forwarded once for chosen and rejected.

Parity with stock TRL with `slimrl_shared_prefix=True` on the patched side: LoRA (adapter-disabled reference) and full
fine-tuning (reference reloaded from disk), precompute_ref_log_probs (the reference pass inside `__init__`), WPO
weighting (the log_sum_sq_probs output), LD-DPO (per-token log-probs split at the shared length), sigmoid + sft,
accumulation, checkpointing; the path is taken (positions counted) and a leaky mask fails parity.
"""

import pytest

try:
    from . import _parity as P
    from . import _pref_parity as H
except ImportError:  # tests/patches is not a package
    import _parity as P
    import _pref_parity as H

from slimrl.patches import shared_prefix as SP

ALGO = "dpo"
BS3 = dict(per_device_train_batch_size=3)
CASES = {
    "sigmoid-lora": (dict(loss_type=["sigmoid"], **BS3), True),
    "ipo-full-ga2": (dict(loss_type=["ipo"], per_device_train_batch_size=2, gradient_accumulation_steps=2), False),
    "wpo-lora-checkpointing": (dict(use_weighting=True, gradient_checkpointing=True, **BS3), True),
    "ld-alpha-sigmoid+sft-full": (dict(ld_alpha=0.5, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5], **BS3),
                                  False),
    "precompute-lora": (dict(precompute_ref_log_probs=True, **BS3), True),
}


def _pair(tmp_path, saved_model, config, lora):
    factory = (lambda: P.tiny_model(0)) if lora else (lambda: P.load_tiny(saved_model))
    return H.build_pair(ALGO, factory, config, str(tmp_path), peft_config=P.lora_config() if lora else None,
                        patched_config={SP.CONFIG_FIELD: True})


@pytest.mark.parametrize("case", list(CASES))
def test_dpo_shared_matches_stock(case, tmp_path, saved_model, unpatched):
    config, lora = CASES[case]
    stock, patched = _pair(tmp_path, saved_model, config, lora)
    precomputed = SP.shared_prefix_stats(patched).shared_calls
    s, p = H.run_pair(ALGO, stock, patched)
    H.assert_traces_match(s, p)
    stats = SP.shared_prefix_stats(patched)
    assert stats.shared_calls > precomputed > 0 if config.get("precompute_ref_log_probs") else stats.shared_calls > 0
    assert not stats.fallback_calls, stats.reasons
    assert stats.positions_forwarded < stats.positions_per_row_path
    # one forward per micro-step for the policy, one for the reference unless precomputed
    per_step = 1 if config.get("precompute_ref_log_probs") else 2
    assert stats.shared_calls - precomputed == per_step * len(s.losses)


def test_dpo_leaky_sharing_fails_parity(tmp_path, saved_model, unpatched, monkeypatch):
    """Negative control: chosen and rejected completions that see each other must fail the stock comparison."""
    from slimrl.ops import shared_prefix as op

    real = op.attention_mask_4d

    def leaky(packed, attn, dtype):
        seg = packed.segment
        return real(packed, attn, dtype) | ((seg[:, None, :] > 0) & (seg[:, :, None] > 0))[:, None]

    monkeypatch.setattr(op, "attention_mask_4d", leaky)
    stock, patched = _pair(tmp_path, saved_model, dict(loss_type=["sigmoid"], **BS3), True)
    s, p = H.run_pair(ALGO, stock, patched)
    assert SP.shared_prefix_stats(patched).shared_calls > 0
    with pytest.raises(AssertionError):
        H.assert_traces_match(s, p)
