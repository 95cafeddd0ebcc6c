"""KTO parity: PatchFastRL("kto") computes what stock TRL computes (loss, gradients, logged metrics) over 2 SGD steps.

Cases: loss_type "kto" (with the no-grad KL forward on mismatched pairs, batch > 1) and "apo_zero_unpaired";
LoRA (adapter-disabled reference) and full fine-tuning (reference reloaded from a saved folder);
precompute_ref_log_probs (reference and reference-KL log-probs computed inside the patched __init__, through
slimrl's head with the chunk knob already set); batch 3 x 1 and 2 x 2 accumulation; unbalanced labels.
"""

import pytest
import torch

from slimrl.ops.lean_logprob import LeanLogProbFunction

import _harness as HS
import _pref_parity as H
import _tiny as T

ALGO = "kto"
BS3 = dict(per_device_train_batch_size=3)
BS2_GA2 = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2)

CASES = {
    "kto-lora": (dict(loss_type="kto", **BS3), True, None),
    "kto-full-ga2-chunks3": (dict(loss_type="kto", desirable_weight=0.7, **BS2_GA2), False, 3),
    "apo_zero_unpaired-lora": (dict(loss_type="apo_zero_unpaired", **BS3), True, None),
    "precompute-kto-full": (dict(loss_type="kto", precompute_ref_log_probs=True, **BS3), False, 2),
    "precompute-apo-lora-ga2": (dict(loss_type="apo_zero_unpaired", precompute_ref_log_probs=True, **BS2_GA2), True, 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kto_matches_stock(case, tmp_path, saved_model, unpatched):
    config, lora, chunks = CASES[case]
    factory = (lambda: T.tiny_model(0)) if lora else (lambda: T.load_tiny(saved_model))
    LeanLogProbFunction.last_forward_chunks = None
    trainers = HS.tiny_sides(H.build_sides, ALGO, config, tmp_path, lora, chunks, factory)
    stock, patched = trainers.stock, trainers.patched
    precompute = config.get("precompute_ref_log_probs", False)
    if precompute:
        assert LeanLogProbFunction.last_forward_chunks == chunks, "the precompute pass ran through slimrl's head"
    assert H.head_file(stock).endswith(H.STOCK_HEAD) and H.head_file(patched).endswith(H.SLIMRL_HEAD)
    if not lora and not precompute:
        assert patched.ref_model.forward.__func__.__code__.co_filename.endswith(H.SLIMRL_HEAD)
    traces = H.run_sides(ALGO, trainers)
    H.assert_traces_match(traces)
    s, p = traces.stock, traces.patched
    if config["loss_type"] == "kto":
        assert stock.calculate_KL and "KL_input_ids" in s.inputs[0] and s.metrics["kl"]
    if precompute:
        assert "ref_logps" in p.inputs[0]
    if chunks is not None:
        assert LeanLogProbFunction.last_forward_chunks == chunks and LeanLogProbFunction.last_backward_chunks == chunks
    labels = torch.cat([x["label"] for x in s.inputs]).bool()
    assert labels.any() and not labels.all(), "both desirable and undesirable completions are trained on"
    assert all(loss != 0 for loss in s.losses)
