"""Negative controls of the parity comparison (_parity's rule): each deliberate error must fail it.

1. The patched loss scaled by 1.001 (a 0.1% error): the loss comparison alone fails, and the gradients' too.
   GRPO, DPO and ORPO (the three harness families).
2. A wrong chunk: the second of three chunks of slimrl's head computes logits 0.1% off (forward and backward).
3. A changed weight (2e-5 on one weight of the patched model, `_parity.nudge_one_weight`) and a changed
   hyper-parameter (ORPO's beta).
A stale vLLM engine (rollouts from weights one step old) is the vLLM tier's control
(tests/generation/test_vllm_tier.py).
"""

import pytest

from slimrl.ops import lean_logprob

import _orpo_cpo_parity as O
import _parity as P
import _pref_parity as H
import _rl_parity as R
import _tiny as T

GRPO_CASE = dict(loss_type="dapo", beta=0.04, num_iterations=2)
WEIGHT_CHANGE = 2e-5  # twice the largest detection floor of the suite (scripts/parity_floor.py)


def _failing(traces, kind: str) -> list[str]:
    """The checks of `kind` ("loss" or "grad") that fail for these traces."""
    values = {}
    for i, losses in enumerate(zip(*(t.losses for t in traces))):
        values[f"loss {i}"] = P.Sides(*losses)
    for i, grads in enumerate(zip(*(t.grads for t in traces))):
        values.update({f"grad {i} {name}": P.Sides(*(g[name] for g in grads)) for name in grads[0]})
    failed = []
    for what, sides in values.items():
        if what.startswith(kind):
            try:
                P.check_sides(what, sides)
            except AssertionError:
                failed.append(what)
    return failed


def _scale_patched_loss(trainers, factor=1.001):
    trainer = trainers.patched
    compute_loss = trainer.compute_loss
    trainer.compute_loss = lambda *args, **kwargs: compute_loss(*args, **kwargs) * factor


def _rl_traces(tmp_path, tamper=None, **build):
    trainers = R.build_sides("grpo", lambda: T.tiny_model(0), GRPO_CASE, str(tmp_path), T.lora_config(), **build)
    if tamper is not None:
        tamper(trainers)
    return R.run_sides("grpo", trainers)


def _dpo_traces(tmp_path, tamper=None, **build):
    trainers = H.build_sides(
        "dpo", lambda: T.tiny_model(0), dict(per_device_train_batch_size=3), str(tmp_path), T.lora_config(), **build
    )
    if tamper is not None:
        tamper(trainers)
    return H.run_sides("dpo", trainers)


def _orpo_traces(tmp_path, tamper=None):
    trainers = O.build_sides("orpo", lambda: T.tiny_model(0), {}, str(tmp_path))
    if tamper is not None:
        tamper(trainers)
    return O.run_sides("orpo", trainers, optimizer_steps=1)


HARNESSES = {
    "grpo": (_rl_traces, R.assert_traces_match),
    "dpo": (_dpo_traces, H.assert_traces_match),
    "orpo": (_orpo_traces, O.assert_traces_match),
}


@pytest.mark.parametrize("family", list(HARNESSES))
def test_untampered_run_passes(family, tmp_path, unpatched):
    run, assert_match = HARNESSES[family]
    assert_match(run(tmp_path))


@pytest.mark.parametrize("family", list(HARNESSES))
def test_loss_off_by_a_thousandth_fails(family, tmp_path, unpatched):
    run, assert_match = HARNESSES[family]
    traces = run(tmp_path, _scale_patched_loss)
    with pytest.raises(AssertionError):
        assert_match(traces)
    assert _failing(traces, "loss"), "the loss comparison alone must see a 0.1% error"
    assert _failing(traces, "grad"), "and so must the gradients'"


def _second_of_three_chunks_off(monkeypatch, factor=1.001):
    """slimrl's head projects each chunk through `ChunkProjector.project`; scale the second chunk's logits."""
    project = lean_logprob.ChunkProjector.project

    def wrong_project(self, start, end):
        logits = project(self, start, end)
        if len(self.bounds) == 3 and (start, end) == self.bounds[1]:
            logits.mul_(factor)
        return logits

    monkeypatch.setattr(lean_logprob.ChunkProjector, "project", wrong_project)


@pytest.mark.parametrize("family", ["grpo", "dpo"])
def test_wrong_chunk_fails(family, tmp_path, unpatched, monkeypatch):
    _second_of_three_chunks_off(monkeypatch)
    run, assert_match = HARNESSES[family]
    with pytest.raises(AssertionError):
        assert_match(run(tmp_path, num_chunks=3))


@pytest.mark.parametrize("family", ["grpo", "dpo"])
def test_changed_weight_fails(family, tmp_path, unpatched):
    def nudge(trainers):
        assert P.nudge_one_weight(trainers.patched.model, WEIGHT_CHANGE).endswith("layers.0.mlp.up_proj.weight")

    run, assert_match = HARNESSES[family]
    with pytest.raises(AssertionError):
        assert_match(run(tmp_path, nudge))


def test_orpo_different_beta_fails(tmp_path, unpatched):
    trainers = O.build_sides(
        "orpo", lambda: T.tiny_model(0), dict(beta=0.1), str(tmp_path), patched_config={"beta": 0.12}
    )
    with pytest.raises(AssertionError):
        O.assert_traces_match(O.run_sides("orpo", trainers, optimizer_steps=1))
