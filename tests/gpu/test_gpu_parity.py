"""Patched GRPO/RLOO/DPO/KTO/ORPO ≡ stock TRL 1.16 on CUDA, fp32 and bf16 autocast (tolerances: _gpu_helpers).

The CPU suite's harnesses run unchanged; only the config puts the trainers on the GPU. On CUDA both sides of
GRPO/RLOO/DPO/KTO score through TRL's Triton kernel (slimrl reuses it, compact tokens, one call when
slimrl_num_chunks is auto, one call per chunk otherwise): the test checks that slimrl's torch fold never ran there.
ORPO's patched forward folds chunk by chunk through slimrl's own LeanLogProbFunction on every device.

bf16 means what `Trainer.train` runs with `bf16=True`: autocast around the forward, fp32 master weights. GRPO/RLOO
enter `accelerator.autocast()` in their own loss code; the offline trainers rely on the forward that `train()` wraps
in autocast (accelerate's `prepare`), which the harness does not call, so their bf16 steps run inside
`torch.autocast` here. Floats are then judged by accuracy against the float64 reference of the same case (see
_gpu_helpers); the float64 sides of a bf16 run are not used.
"""

import pytest

from slimrl.ops.lean_logprob import LeanLogProbFunction

from _gpu_helpers import (
    BF16_ACCURACY_FACTOR,
    BF16_CONTROL_SCALE,
    BF16_FLOOR,
    FP32_CONTROL_SCALE,
    MARKS,
    OFFLINE,
    assert_sides_match,
    cuda_config,
    head_file,
    report,
    run_sides,
    same_batches,
    trace_errors,
)

pytestmark = MARKS

SLIMRL_HEAD = "slimrl/ops/logprob.py"
# case: (algorithm, LoRA, slimrl_num_chunks (None = auto), config). GRPO/RLOO cases generate once (num_iterations=2
# over 2 steps), so the fp32 and bf16 runs train on the same rollouts and their numbers compare.
CASES = {
    "grpo-lora-dapo-ref-iters2": (
        "grpo",
        True,
        None,
        dict(loss_type="dapo", beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2),
    ),
    "grpo-full-chunks3": (
        "grpo",
        False,
        3,
        dict(loss_type="grpo", beta=0.0, num_iterations=2, per_device_train_batch_size=6, num_generations=3),
    ),
    "rloo-lora-iters2": ("rloo", True, None, dict(num_iterations=2, per_device_train_batch_size=4, num_generations=2)),
    "dpo-lora-sigmoid": ("dpo", True, None, dict(loss_type=["sigmoid"], per_device_train_batch_size=3)),
    "kto-lora": ("kto", True, None, dict(loss_type="kto", per_device_train_batch_size=3)),
    "orpo-lora": ("orpo", True, None, dict(beta=0.3)),
}


def _run(case: str, precision: str, out_dir: str, lm_head_scale: float | None = None):
    """The sides of `case` on the GPU in `precision`, run through the harness: (trainers, traces)."""
    algorithm, lora, chunks, config = CASES[case]
    LeanLogProbFunction.last_forward_chunks = None
    trainers, traces = run_sides(
        algorithm,
        dict(config, **cuda_config(precision)),
        out_dir,
        lora,
        chunks,
        lm_head_scale,
        bf16_forward=precision == "bf16" and algorithm in OFFLINE,
    )
    for trainer in trainers:
        assert trainer.args.device.type == "cuda", trainer.args.device
        assert next(trainer.model.parameters()).is_cuda
    return trainers, traces


def _check_head(case: str, patched) -> None:
    assert head_file(patched).endswith(SLIMRL_HEAD) or CASES[case][0] == "orpo"
    if CASES[case][0] == "orpo":
        assert LeanLogProbFunction.last_forward_chunks is not None, "ORPO's chunked forward did not run"
    else:  # TRL's Triton kernel, reused: slimrl's torch fold must not have run on CUDA
        assert LeanLogProbFunction.last_forward_chunks is None, "slimrl's torch fold ran on CUDA"


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_parity_on_cuda(case, tmp_path, unpatched):
    trainers, traces = _run(case, "fp32", str(tmp_path))
    _check_head(case, trainers.patched)
    assert_sides_match(CASES[case][0], traces)
    report(
        f"fp32 parity {case}",
        patched=trace_errors(traces.patched, traces.reference),
        stock=trace_errors(traces.stock, traces.reference),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_parity_on_cuda(case, tmp_path, unpatched):
    """Same rollouts/batches as stock, and no less accurate than stock against the float64 reference of the case."""
    truth = _run(case, "fp32", str(tmp_path / "fp32"))[1].reference
    trainers, traces = _run(case, "bf16", str(tmp_path / "bf16"))
    s, p = traces.stock, traces.patched
    assert trainers.stock.args.bf16 and trainers.patched.args.bf16
    _check_head(case, trainers.patched)
    assert same_batches(p, s), "patched and stock trained on different batches (rollouts diverged)"
    assert same_batches(s, truth), "the bf16 and fp32 runs trained on different batches: nothing to compare"
    stock_err, patched_err = trace_errors(s, truth), trace_errors(p, truth)
    report(
        f"bf16 parity {case}", stock_vs_fp32=stock_err, patched_vs_fp32=patched_err, patched_vs_stock=trace_errors(p, s)
    )
    assert stock_err["grads"] > 0, "the bf16 run computed exactly what fp32 did: autocast was not active"
    for key, err in patched_err.items():
        assert err <= BF16_ACCURACY_FACTOR * stock_err[key] + BF16_FLOOR, (key, err, stock_err[key])


def test_fp32_negative_control_fails(tmp_path, unpatched):
    """A 0.1% error on the patched side (its lm_head scaled) fails the fp32 comparison."""
    _, traces = _run("dpo-lora-sigmoid", "fp32", str(tmp_path), lm_head_scale=FP32_CONTROL_SCALE)
    with pytest.raises(AssertionError):
        assert_sides_match("dpo", traces)


def test_bf16_negative_control_fails(tmp_path, unpatched):
    """A BF16_CONTROL_SCALE error on the patched side breaks the bf16 accuracy rule."""
    truth = _run("dpo-lora-sigmoid", "fp32", str(tmp_path / "fp32"))[1].reference
    traces = _run("dpo-lora-sigmoid", "bf16", str(tmp_path / "bf16"), lm_head_scale=BF16_CONTROL_SCALE)[1]
    stock_err, patched_err = trace_errors(traces.stock, truth), trace_errors(traces.patched, truth)
    assert any(err > BF16_ACCURACY_FACTOR * stock_err[key] + BF16_FLOOR for key, err in patched_err.items())
