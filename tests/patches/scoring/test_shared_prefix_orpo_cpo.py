"""Shared-prefix forwards in the patched ORPO and CPO trainers: the prompt forwarded once for chosen and rejected.

Parity (the sides of tests/patches/_parity.py, harness _orpo_cpo_parity) with `slimrl_shared_prefix=True` on the
patched side: ORPO full fine-tuning (accumulation 2) and LoRA (checkpointing), CPO sigmoid and simpo (with
`slimrl_num_chunks`) with LoRA; the batches' prompts have mixed lengths and chosen / rejected rows are right-padded
to TRL's concatenated length. Every logged metric is compared, the mean-logits metrics (every position, padding
included) among them. Each case checks the path was taken (positions counted); a leaky mask fails parity; a model
type not verified falls back with its reason; "auto" keeps a tiny forward per-row; the configs declare the field.
"""

import logging

import pytest

from slimrl.patches.scoring import shared_prefix as SP
from slimrl.patches.setup import shared_prefix_rules as rules

import _orpo_cpo_parity as H
import _parity as P
import _tiny as T

FORCED = {rules.CONFIG_FIELD: True}
CASES = {  # (algorithm, LoRA, config of every side, patched side's extra config)
    "orpo-full-ga2": ("orpo", False, dict(gradient_accumulation_steps=2, per_device_train_batch_size=2), {}),
    "orpo-lora-checkpointing": ("orpo", True, dict(beta=0.3, gradient_checkpointing=True), {}),
    "cpo-sigmoid-lora": ("cpo", True, dict(loss_type="sigmoid", label_smoothing=0.1), {}),
    "cpo-simpo-lora-chunks": (
        "cpo",
        True,
        dict(loss_type="simpo", cpo_alpha=0.5, simpo_gamma=0.3),
        dict(slimrl_num_chunks=3),
    ),
}


def _sides(algorithm, tmp_path, config, lora, factory=lambda: T.tiny_model(0), patched=None):
    return H.build_sides(
        algorithm,
        factory,
        config,
        str(tmp_path),
        H.lora_config() if lora else None,
        patched_config={**FORCED, **(patched or {})},
    )


@pytest.mark.parametrize("case", list(CASES))
def test_shared_matches_stock(case, tmp_path, unpatched):
    algorithm, lora, config, patched = CASES[case]
    trainers = _sides(algorithm, tmp_path, config, lora, patched=patched)
    traces = H.run_sides(algorithm, trainers)
    H.assert_traces_match(traces)
    stats = SP.shared_prefix_stats(trainers.patched)
    assert not stats.fallback_calls, stats.reasons
    assert stats.shared_calls == len(traces.stock.losses), "one packed forward per micro-step"
    assert stats.positions_forwarded < stats.positions_per_row_path


def test_leaky_sharing_fails_parity(tmp_path, unpatched, leaky_sharing):
    """Negative control: chosen and rejected completions that see each other must fail the stock comparison."""
    trainers = _sides("orpo", tmp_path, {}, True)
    traces = H.run_sides("orpo", trainers, optimizer_steps=1)
    assert SP.shared_prefix_stats(trainers.patched).shared_calls > 0
    with pytest.raises(AssertionError):
        H.assert_traces_match(traces)


def test_unverified_model_type_falls_back_with_one_reason(tmp_path, unpatched, caplog):
    def unverified():
        model = T.tiny_model(0)
        model.config.model_type = "llama-unverified"
        return model

    trainers = _sides("cpo", tmp_path, {}, True, factory=unverified)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        traces = H.run_sides("cpo", trainers)
    H.assert_traces_match(traces)
    stats = SP.shared_prefix_stats(trainers.patched)
    assert stats.shared_calls == 0 and stats.fallback_calls == len(traces.stock.losses)
    assert stats.positions_forwarded == stats.positions_per_row_path
    reason = "model type 'llama-unverified' is not verified for shared-prefix forwards"
    assert list(stats.reasons) == [reason]
    assert sum(reason in r.getMessage() for r in caplog.records) == 1, "logged once per trainer"


def test_auto_keeps_the_per_row_forward_of_a_tiny_model(tmp_path, unpatched):
    """ "auto" (the default) applies the measured rule: the parity model's forwards are far below its minimum size."""
    with P.patched_state("orpo"):
        trainer = H.build_trainer("orpo", T.tiny_model(0), H.make_config("orpo", str(tmp_path)))
        trainer.training_step(trainer.model, next(iter(trainer.get_train_dataloader())))
    stats = SP.shared_prefix_stats(trainer)
    assert (stats.shared_calls, stats.fallback_calls) == (0, 1)
    assert [reason.split(":")[0] for reason in stats.reasons] == ["the forward is under 1e+08 FLOPs"]


@pytest.mark.parametrize("algorithm", ["orpo", "cpo"])
def test_config_field(tmp_path, unpatched, algorithm):
    with P.patched_state(algorithm):
        assert H.make_config(algorithm, str(tmp_path)).slimrl_shared_prefix == rules.AUTO
        assert H.make_config(algorithm, str(tmp_path), slimrl_shared_prefix=False).slimrl_shared_prefix is False
        with pytest.raises(ValueError, match="slimrl_shared_prefix must be 'auto', True or False, got 'yes'"):
            H.make_config(algorithm, str(tmp_path), slimrl_shared_prefix="yes")
