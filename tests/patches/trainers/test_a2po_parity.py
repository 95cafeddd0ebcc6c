"""Patched A2POTrainer ≡ stock TRL 1.16's experimental A2POTrainer (A*-PO: V* from reference samples, then an
on-policy least-squares regression): same Stage 1 estimates, rollouts, reference log-probs, loss, gradients, metrics
and parameters over 2 steps (the rule of _parity).

Cases: full fine-tuning with 3 chunks; a user-wrapped PeftModel (TRL copies it as the frozen reference) with gradient
accumulation and automatic chunks; gradient checkpointing with 1 chunk and the all-incorrect filter off. Negative
control: log-probs 0.1% off fail. Checks before Stage 1: the prompt and completion lengths against max_seq_length, a
model loaded with fast_inference=True.
"""

import pytest
import torch

import _online_parity as O
import _parity as P
import _tiny as T

ALGO = "a2po"

DEFAULT_TIER = "full-chunks3"  # the case the default tier runs; the others are slow tier
CASES = {
    "full-chunks3": (lambda: T.tiny_model(0), 3, {}),
    "peftmodel-ga2-auto": (T.peft_model, -1, dict(gradient_accumulation_steps=2, per_device_train_batch_size=2)),
    "full-checkpointing-nofilter-chunks1": (
        lambda: T.tiny_model(0),
        1,
        dict(gradient_checkpointing=True, filter_all_incorrect=False),
    ),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == DEFAULT_TIER else pytest.mark.slow) for c in CASES])
def test_a2po_matches_stock(case, tmp_path, unpatched):
    factory, chunks, config = CASES[case]
    trainers = O.build_sides(ALGO, factory, config, str(tmp_path), num_chunks=chunks)
    traces = O.run_sides(ALGO, trainers)
    O.assert_traces_match(traces)
    assert all("ref_logps" in x for x in traces.stock.inputs)
    rewards = torch.cat([x["rewards"] for x in traces.stock.inputs])
    assert set(rewards.tolist()) == {0.0, 1.0}, "the regression should see both rewards"
    assert "peak_memory_gb" in traces.patched.metrics


@pytest.mark.slow
def test_logprobs_off_by_a_thousandth_fail(tmp_path, unpatched):
    trainers = O.build_sides(ALGO, lambda: T.tiny_model(0), {}, str(tmp_path), num_chunks=3)
    logps = trainers.patched._get_sequence_logps
    trainers.patched._get_sequence_logps = lambda *a, **kw: logps(*a, **kw) * 1.001
    traces = O.run_sides(ALGO, trainers)
    with pytest.raises(AssertionError):
        O.assert_traces_match(traces)


def test_lengths_and_fast_inference_refused_before_stage_one(tmp_path, unpatched):
    with P.side_state("patched", ALGO):
        model = T.tiny_model(0)
        model.max_seq_length = 16
        args = O.make_config(ALGO, str(tmp_path), max_prompt_length=30, max_completion_length=7)
        with pytest.raises(ValueError, match=r"prompt\(s\) in train_dataset .* plus max_completion_length \(7\)"):
            O.build_trainer(ALGO, model, args)
        O.build_trainer(ALGO, model, O.make_config(ALGO, str(tmp_path), max_prompt_length=9, max_completion_length=7))
        model.vllm_engine = object()
        with pytest.raises(ValueError, match="fast_inference=True"):
            O.build_trainer(ALGO, model, O.make_config(ALGO, str(tmp_path)))
