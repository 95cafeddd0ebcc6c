"""Shared-prefix forwards in the patched DPOTrainer: the prompt forwarded once for chosen and rejected.

Parity (the sides of tests/patches/_parity.py) with `slimrl_shared_prefix=True` on the patched side: LoRA
(adapter-disabled reference) and full fine-tuning (reference reloaded from disk), precompute_ref_log_probs (the
reference pass inside `__init__`), WPO weighting (the log_sum_sq_probs output), LD-DPO (per-token log-probs split at
the shared length), sigmoid + sft, accumulation, checkpointing; the path is taken (positions counted) and a leaky
mask fails parity. DPOConfig declares `slimrl_shared_prefix` (ORPO and CPO too: test_shared_prefix_orpo_cpo.py);
the other offline configs refuse it.
"""

import pytest

from slimrl.patches.scoring import shared_prefix as SP
from slimrl.patches.seams import resolve
from slimrl.patches.setup import shared_prefix_rules as rules

import _parity as P
import _pref_parity as H
import _tiny as T

ALGO = "dpo"
BS3 = dict(per_device_train_batch_size=3)
CASES = {
    "sigmoid-lora": (dict(loss_type=["sigmoid"], **BS3), True),
    "ipo-full-ga2": (dict(loss_type=["ipo"], per_device_train_batch_size=2, gradient_accumulation_steps=2), False),
    "wpo-lora-checkpointing": (dict(use_weighting=True, gradient_checkpointing=True, **BS3), True),
    "ld-alpha-sigmoid+sft-full": (
        dict(ld_alpha=0.5, loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5], **BS3),
        False,
    ),
    "precompute-lora": (dict(precompute_ref_log_probs=True, **BS3), True),
}


def _sides(tmp_path, saved_model, config, lora):
    factory = (lambda: T.tiny_model(0)) if lora else (lambda: T.load_tiny(saved_model))
    return H.build_sides(
        ALGO,
        factory,
        config,
        str(tmp_path),
        peft_config=T.lora_config() if lora else None,
        patched_config={rules.CONFIG_FIELD: True},
    )


@pytest.mark.parametrize("case", list(CASES))
def test_dpo_shared_matches_stock(case, tmp_path, saved_model, unpatched):
    config, lora = CASES[case]
    trainers = _sides(tmp_path, saved_model, config, lora)
    precomputed = SP.shared_prefix_stats(trainers.patched).shared_calls
    traces = H.run_sides(ALGO, trainers)
    H.assert_traces_match(traces)
    stats = SP.shared_prefix_stats(trainers.patched)
    assert stats.shared_calls > precomputed > 0 if config.get("precompute_ref_log_probs") else stats.shared_calls > 0
    assert not stats.fallback_calls, stats.reasons
    assert stats.positions_forwarded < stats.positions_per_row_path
    # one forward per micro-step for the policy, one for the reference unless precomputed
    per_step = 1 if config.get("precompute_ref_log_probs") else 2
    assert stats.shared_calls - precomputed == per_step * len(traces.stock.losses)


def test_dpo_leaky_sharing_fails_parity(tmp_path, saved_model, unpatched, leaky_sharing):
    """Negative control: chosen and rejected completions that see each other must fail the stock comparison."""
    trainers = _sides(tmp_path, saved_model, dict(loss_type=["sigmoid"], **BS3), True)
    traces = H.run_sides(ALGO, trainers)
    assert SP.shared_prefix_stats(trainers.patched).shared_calls > 0
    with pytest.raises(AssertionError):
        H.assert_traces_match(traces)


def test_dpo_config_field(tmp_path, unpatched):
    with P.patched_state(ALGO):
        assert H.make_config(ALGO, str(tmp_path)).slimrl_shared_prefix == rules.AUTO
        assert H.make_config(ALGO, str(tmp_path), slimrl_shared_prefix=False).slimrl_shared_prefix is False
        with pytest.raises(ValueError, match="slimrl_shared_prefix must be 'auto', True or False, got 1"):
            H.make_config(ALGO, str(tmp_path), slimrl_shared_prefix=1)


@pytest.mark.parametrize(
    "algorithm, config_path", [("kto", "trl.KTOConfig"), ("sft", "trl.SFTConfig"), ("reward", "trl.RewardConfig")]
)
def test_other_offline_configs_refuse_the_field(tmp_path, unpatched, algorithm, config_path):
    """Only the families that use it declare the field: elsewhere it is an unknown keyword, as TRL refuses any."""
    with P.patched_state(algorithm):
        config_cls = resolve(config_path)
        assert config_cls(output_dir=str(tmp_path), report_to="none").slimrl_num_chunks is not None
        with pytest.raises(TypeError, match="slimrl_shared_prefix"):
            config_cls(output_dir=str(tmp_path), report_to="none", slimrl_shared_prefix=True)
