"""TRL's Triton log-prob path (what slimrl's head runs on CUDA) against slimrl's own torch fold (LeanLogProbFunction,
what it runs elsewhere), both against a float64 full-logits reference computed on the GPU.

Shapes: 1000 tokens, H=64, V=50,000 (two of TRL's 32768-wide vocabulary tiles, the second partial). Outputs:
log-probs and entropy; the backward is that of sum(log_probs) + 0.5 * sum(entropy), so both gradient terms run.
fp32: both within 1e-5 of float64 (norm-relative; TF32 is off, see conftest). bf16 autocast: slimrl's fold may round
at other places than TRL's kernel, so it must be no less accurate than it (at most 2x its error, + 1e-4).
"""

import pytest
import torch

from slimrl.ops.chunking import resolve_num_chunks
from slimrl.ops.lean_logprob import LeanLogProbFunction
from slimrl.ops.logprob import fused_logprobs

from _gpu_helpers import MARKS, rel_err, report

pytestmark = MARKS

N, HIDDEN, V = 1000, 64, 50_000
OUTPUTS = ("log_probs", "entropy")
FP32_RTOL = 1e-5
OPTIONS = {
    "plain": dict(temperature=1.0, softcap=None, logit_scale=1.0, bias=False),
    "temp-softcap-scale-bias": dict(temperature=0.7, softcap=30.0, logit_scale=0.5, bias=True),
}


def _inputs(bias: bool, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(N, HIDDEN, device="cuda", generator=g)
    weight = torch.randn(V, HIDDEN, device="cuda", generator=g) * 0.3  # logits of a few units, as in a trained model
    b = torch.randn(V, device="cuda", generator=g) * 0.1 if bias else None
    targets = torch.randint(0, V, (N,), device="cuda", generator=g)
    return hidden, weight, b, targets


def _reference(hidden, weight, bias, targets, temperature, softcap, logit_scale):
    """float64 full logits: outputs and the gradients of sum(log_probs) + 0.5 * sum(entropy)."""
    leaves = [x.double().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    h, w, b = leaves
    z = h @ w.T + (b if b is not None else 0.0)
    z = z * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = torch.log_softmax(z / temperature, -1)
    log_probs = logp.gather(1, targets.unsqueeze(1)).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1)
    (log_probs.sum() + 0.5 * entropy.sum()).backward()
    return _collect(log_probs, entropy, leaves)


def _collect(log_probs, entropy, leaves) -> dict:
    out = {
        "log_probs": log_probs.detach(),
        "entropy": entropy.detach(),
        "grad hidden": leaves[0].grad,
        "grad weight": leaves[1].grad,
    }
    if leaves[2] is not None:
        out["grad bias"] = leaves[2].grad
    return out


def _run(path: str, inputs, temperature, softcap, logit_scale, num_chunks=-1, bf16=False) -> dict:
    hidden, weight, bias, targets = inputs
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
    h, w, b = leaves
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        if path == "triton":  # slimrl's CUDA path: TRL's ChunkedLogProbFunction (Triton fold)
            out = fused_logprobs(h, w, b, targets, temperature, softcap, logit_scale, OUTPUTS, num_chunks=num_chunks)
        else:  # slimrl's own torch fold, the path of every other device
            chunks = resolve_num_chunks(N, V, num_chunks)
            out = LeanLogProbFunction.apply(h, w, b, targets, temperature, chunks, softcap, logit_scale, OUTPUTS)
    (out[0].sum() + 0.5 * out[1].sum()).backward()
    return _collect(out[0], out[1], leaves)


def _errors(result: dict, reference: dict) -> dict:
    return {k: rel_err(result[k], reference[k]) for k in reference}


def test_cuda_runs_the_triton_kernel_not_the_torch_fold():
    from trl.kernels.chunked_logprob import _use_triton

    assert _use_triton(torch.device("cuda")), "TRL sees no Triton on this CUDA device"
    LeanLogProbFunction.last_forward_chunks = None
    _run("triton", _inputs(False), 1.0, None, 1.0)
    assert LeanLogProbFunction.last_forward_chunks is None


@pytest.mark.parametrize("option", list(OPTIONS))
def test_fp32_triton_and_torch_fold_match_float64(option):
    opts = dict(OPTIONS[option])
    inputs = _inputs(opts.pop("bias"))
    reference = _reference(*inputs, **opts)
    for path in ("triton", "lean"):
        errors = _errors(_run(path, inputs, **opts), reference)
        report(f"op fp32 {option} {path}", **errors)
        assert max(errors.values()) <= FP32_RTOL, (path, errors)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_bf16_torch_fold_as_accurate_as_triton(option):
    opts = dict(OPTIONS[option])
    inputs = _inputs(opts.pop("bias"))
    reference = _reference(*inputs, **opts)
    triton = _errors(_run("triton", inputs, bf16=True, **opts), reference)
    lean = _errors(_run("lean", inputs, bf16=True, **opts), reference)
    report(f"op bf16 {option}", triton=triton, lean=lean)
    assert max(triton.values()) > FP32_RTOL, "bf16 autocast had no effect"
    for key in reference:
        assert lean[key] <= 2 * triton[key] + 1e-4, (key, lean[key], triton[key])


def test_triton_in_chunks_equals_one_call():
    inputs = _inputs(False)
    whole, chunked = (_run("triton", inputs, 1.0, None, 1.0, num_chunks=n) for n in (-1, 3))
    for key in whole:
        assert rel_err(chunked[key], whole[key]) <= FP32_RTOL, key


def test_negative_control_a_0_1_percent_temperature_error_fails():
    inputs = _inputs(False)
    wrong = _reference(*inputs, temperature=1.001, softcap=None, logit_scale=1.0)
    for path in ("triton", "lean"):
        errors = _errors(_run(path, inputs, 1.0, None, 1.0), wrong)
        assert max(errors.values()) > FP32_RTOL, (path, errors)
