"""Patched GKD / GOLD / DistillationTrainer = stock TRL 1.16 (loss, gradients, parameters, metrics), each loss variant,
on-policy fractions off and on (seeded, so every side samples the same completions). The default tier runs one case
per trainer, the base teacher on GKD and the negative controls on GKD; the other variants are slow tier."""

import pytest

from slimrl.ops.chunked_divergence import ChunkedDivergenceFunction

import _distill_parity as H

# the cases the default tier runs; every other case is slow tier
DEFAULT_TIER = {"gkd": "jsd-onpolicy", "gold": "forward-kl-temperature", "distillation": "jsd"}


def tiered(algorithm, cases):
    def marks(case):
        return () if case == DEFAULT_TIER[algorithm] else (pytest.mark.slow,)

    return [pytest.param(case, marks=marks(case)) for case in cases]


ALGORITHMS = ["gkd", *(pytest.param(name, marks=pytest.mark.slow) for name in ("gold", "distillation"))]


# (config, how many of the run's micro-steps generate their completions)
GKD_CASES = {
    "jsd-offpolicy": (dict(beta=0.5), "none"),
    "forward-kl": (dict(beta=0.0), "none"),
    "reverse-kl-ga2": (dict(beta=1.0, gradient_accumulation_steps=2, per_device_train_batch_size=2), "none"),
    "jsd-onpolicy": (dict(beta=0.3, lmbda=0.4, temperature=0.8), "some"),
    "seq-kd": (dict(beta=0.5, lmbda=0.0, seq_kd=True), "all"),
}


def _run(algorithm, config, tmp_path, generated, **build):
    ChunkedDivergenceFunction.last_chunks = 0
    traces = H.run_sides(algorithm, H.build_sides(algorithm, config, str(tmp_path), **build))
    H.assert_traces_match(traces)
    assert ChunkedDivergenceFunction.last_chunks > 0, "the patched side never ran slimrl's divergence"
    assert traces.stock.losses[0] != traces.stock.losses[-1]
    n, total = H.generated_steps(traces), len(traces.stock.losses)
    assert {"none": n == 0, "some": 0 < n < total, "all": n == total}[generated], (generated, n, total)
    return traces


@pytest.mark.parametrize("case", tiered("gkd", GKD_CASES))
def test_gkd_parity(tmp_path, unpatched, case):
    config, generated = GKD_CASES[case]
    _run("gkd", config, tmp_path, generated)


GOLD_CASES = {
    "jsd-temperature": (dict(beta=0.5, temperature=0.7), "none"),
    "forward-kl-temperature": (dict(beta=0.0, temperature=1.3), "none"),
    "reverse-kl": (dict(beta=1.0), "none"),
    "jsd-onpolicy-ga2": (
        dict(beta=0.5, lmbda=0.5, temperature=0.9, gradient_accumulation_steps=2, per_device_train_batch_size=2),
        "some",
    ),
}


@pytest.mark.parametrize("case", tiered("gold", GOLD_CASES))
def test_gold_parity(tmp_path, unpatched, case):
    config, generated = GOLD_CASES[case]
    _run("gold", config, tmp_path, generated)


DISTILLATION_CASES = {
    "jsd": dict(beta=0.5),
    "forward-kl-temperature": dict(beta=0.0, temperature=0.7),
    "reverse-kl-ga2": dict(beta=1.0, gradient_accumulation_steps=2, per_device_train_batch_size=2),
}


@pytest.mark.parametrize("case", tiered("distillation", DISTILLATION_CASES))
def test_distillation_parity(tmp_path, unpatched, case):
    _run("distillation", DISTILLATION_CASES[case], tmp_path, "all")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_base_teacher_parity(tmp_path, unpatched, algorithm):
    """Student = a LoRA on the teacher's base, teacher = the same base with the adapter disabled (one base in
    memory), on every side alike."""
    config = dict(beta=0.5, lmbda=0.4) if algorithm == "gkd" else dict(beta=0.5)
    generated = {"gkd": "some", "gold": "none", "distillation": "all"}[algorithm]
    traces = _run(algorithm, config, tmp_path, generated, student_factory=H.lora_student, teacher_factory=None)
    assert all("lora" in name for name in traces.stock.params)


@pytest.mark.slow
def test_gkd_lora_from_peft_config_parity(tmp_path, unpatched):
    import _tiny as T

    _run("gkd", dict(beta=0.5), tmp_path, "none", peft_config=T.lora_config())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_negative_control_loss_off_by_a_thousandth_fails(tmp_path, unpatched, algorithm):
    trainers = H.build_sides(algorithm, dict(beta=0.5), str(tmp_path))
    compute_loss = trainers.patched.compute_loss
    trainers.patched.compute_loss = lambda *args, **kwargs: compute_loss(*args, **kwargs) * 1.001
    traces = H.run_sides(algorithm, trainers, optimizer_steps=1)
    with pytest.raises(AssertionError, match="micro-step 0: loss"):
        H.assert_steps_match(traces)


def test_negative_control_other_beta_fails(tmp_path, unpatched):
    trainers = H.build_sides("gkd", dict(beta=0.5), str(tmp_path), patched_config=dict(beta=0.502))
    traces = H.run_sides("gkd", trainers, optimizer_steps=1)
    with pytest.raises(AssertionError, match="micro-step 0: loss"):
        H.assert_steps_match(traces)
