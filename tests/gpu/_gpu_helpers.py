"""Shared pieces of the GPU tier (a plain module: tests/ has no packages).

Choices, and why:
- Every GPU test module sets `pytestmark = MARKS`: the `gpu` marker (so the default tier, `-m 'not ... and not gpu'`,
  never collects them as runnable) and a skip with the reason when CUDA is absent (so `pytest -m gpu` on a CPU
  machine collects everything and skips cleanly).
- The stock-vs-patched harnesses are the CPU suite's own (tests/patches/_parity.py, _pref_parity.py,
  _orpo_cpo_parity.py), imported, never copied: on CUDA only the config differs (`use_cpu=False`, `bf16`), and the
  HF Trainer then puts both models on the GPU. This module is the only one that calls them (the "harness adapter"
  section below) and HARNESS_DIRS the one place that says where they live: when the harnesses change, only this
  section follows.
- Tolerances. fp32: the harnesses' own rule (tests/patches/_parity.py: against a float64 reference of the same run,
  patched's error within K x stock's own plus a measured floor), i.e. the same bar as on CPU.
  bf16 (autocast over fp32 master weights, what `bf16=True` trains with): no fixed patched-vs-stock tolerance can be
  both safe and sharp. bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3), and after two SGD steps on
  these tiny models stock TRL's own bf16 run sits far from its fp32 run (measured with the CPU harness, norm-relative
  over the whole model: gradients 0.03 for GRPO LoRA to 1.3 for ORPO, where the second step's gradient nearly
  cancels; losses 8e-4 to 3e-2): a fixed bound would have to be that loose. Implementations that round at different
  places (stock ORPO rounds the full `[2B, T, V]` logits to bf16, slimrl folds them chunk by chunk in fp32) are
  equally legitimate. So bf16 is judged by accuracy: against the float64 reference of the same case (its fp32 run's
  reference side; same rollouts / batches, checked exactly), the patched bf16 error (loss, all gradients, final
  weights) must be at most
  BF16_ACCURACY_FACTOR (2) times stock TRL's bf16 error, plus BF16_FLOOR (u / 10: differences below a tenth of one
  bf16 rounding are noise whatever stock's error is). The CPU suite applies the same rule to bf16 autocast
  (tests/patches/trainers/test_grpo_parity.py).
- Measured numbers (errors, peaks) are appended as JSON lines to $SLIMRL_GPU_REPORT when it is set, for the README.
- Negative controls: a 0.1% change of the patched model's lm_head must fail the fp32 comparison. At bf16 the rule
  cannot see errors smaller than stock's own bf16 error; its control is a 5% change of the lm_head (DPO), which must
  break it (on the CPU harness the loss error then grows from 8e-4 to 2.8e-2 against a bound of 2.1e-3; 1% gave
  7e-3, 0.1% stayed within bf16 noise).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; read when CUDA starts

import pytest  # noqa: E402
import torch  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
HARNESS_DIRS = (TESTS / "patches", TESTS / "models")  # the CPU helpers reused here (also on pytest's pythonpath)
for _dir in HARNESS_DIRS:
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

import _orpo_cpo_parity as O  # noqa: E402
import _parity as P  # noqa: E402
import _pref_parity as H  # noqa: E402
import _rl_parity as R  # noqa: E402
import _tiny as T  # noqa: E402

CUDA = torch.cuda.is_available()
MARKS = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

BF16_ACCURACY_FACTOR = 2.0
BF16_FLOOR = 2.0**-8 / 10
FP32_CONTROL_SCALE, BF16_CONTROL_SCALE = 1.001, 1.05  # negative controls: the patched lm_head scaled by this


def report(test: str, **values) -> None:
    """Append one JSON line (test name, device, values) to $SLIMRL_GPU_REPORT, if set."""
    path = os.environ.get("SLIMRL_GPU_REPORT")
    if not path:
        return
    device = torch.cuda.get_device_name(0) if CUDA else "cpu"
    with open(path, "a") as f:
        f.write(json.dumps({"test": test, "device": device, **values}) + "\n")


def cuda_config(precision: str, **overrides) -> dict:
    """Trainer-config keywords for a run on the GPU in `precision` ("fp32" or "bf16" autocast)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(precision)
    return dict(use_cpu=False, bf16=precision == "bf16", **overrides)


# ---------------------------------------------------------------------------------------------- harness adapter
RL, OFFLINE = ("grpo", "rloo"), ("dpo", "kto", "orpo")
HARNESS = {"grpo": R, "rloo": R, "dpo": H, "kto": H, "orpo": O}
patched_state, trainable, rel_err, logged = P.patched_state, P.trainable, P.rel_err, T.logged


def tiny_model():
    return T.tiny_model(0)


def lora_config():
    return T.lora_config()


def grpo_trainer(out_dir: str, model=None, peft: bool = True, **config):
    """A GRPO trainer on the harness's tiny model and data, built in the current patch state."""
    args = R.make_config("grpo", out_dir, **config)
    return R.build_trainer("grpo", tiny_model() if model is None else model, args, lora_config() if peft else None)


def grpo_step(trainer) -> float:
    """One `training_step` of the trainer on one generation batch (rollouts included); returns the loss."""
    return float(trainer.training_step(trainer.model, R.generation_batch(trainer.args), None))


def dpo_trainer(out_dir: str, **config):
    return H.build_trainer("dpo", tiny_model(), H.make_config("dpo", out_dir, **config), lora_config())


def dpo_step(trainer) -> float:
    batches, num_items = trainer.get_batch_samples(iter(trainer.get_train_dataloader()), 1, trainer.args.device)
    return float(trainer.training_step(trainer.model, batches[0], num_items))


def run_sides(
    algorithm: str,
    config: dict,
    out_dir: str,
    lora: bool,
    num_chunks=None,
    lm_head_scale=None,
    bf16_forward: bool = False,
):
    """The harness's sides of `algorithm` (stock, patched, float64 reference, perturbed) on identical tiny models,
    2 SGD steps each: (trainers, traces), both `P.Sides`. `lm_head_scale` multiplies the patched lm_head (negative
    controls); `bf16_forward` runs the steps inside bf16 autocast (what `train()` gives the forward)."""
    peft = lora_config() if lora else None
    harness = HARNESS[algorithm]
    if algorithm == "orpo":
        trainers = O.build_sides(algorithm, tiny_model, config, out_dir, peft)
    else:
        trainers = harness.build_sides(algorithm, tiny_model, config, out_dir, peft_config=peft, num_chunks=num_chunks)
    if lm_head_scale is not None:
        scale_lm_head(trainers.patched, lm_head_scale)
    with torch.autocast(trainers.stock.args.device.type, dtype=torch.bfloat16) if bf16_forward else nullcontext():
        return trainers, harness.run_sides(algorithm, trainers)


def assert_sides_match(algorithm: str, traces) -> None:
    """The harness's own comparison (exact integer inputs, the rule of _parity for every float)."""
    HARNESS[algorithm].assert_traces_match(traces)


def head_file(trainer) -> str:
    return T.head_file(trainer)


# ------------------------------------------------------------------------------------------- bf16 accuracy rule
def trace_errors(trace, reference) -> dict[str, float]:
    """Norm-relative errors of `trace` against `reference` (same case, same batches), each over the whole model so a
    parameter whose gradient is near zero does not dominate: the losses (relative to the largest reference loss),
    all gradients of a micro-step together (worst micro-step), all final trainable weights together."""
    scale = max(max(abs(b) for b in reference.losses), 1e-12)
    loss = max(abs(a - b) for a, b in zip(trace.losses, reference.losses)) / scale
    grads = max(rel_err(_flat(g, r), _flat(r, r)) for g, r in zip(trace.grads, reference.grads))
    params = rel_err(_flat(trace.params, reference.params), _flat(reference.params, reference.params))
    return {"loss": loss, "grads": grads, "params": params}


def _flat(tensors: dict, keys: dict) -> torch.Tensor:
    return torch.cat([tensors[name].double().flatten().cpu() for name in sorted(keys)])


def same_batches(trace, reference) -> bool:
    """Whether two runs trained on identical token batches (integer tensors equal), so their numbers compare."""
    for a, b in zip(trace.inputs, reference.inputs):
        for key, value in b.items():
            if not value.is_floating_point() and not torch.equal(a[key].cpu(), value.cpu()):
                return False
    return len(trace.inputs) == len(reference.inputs)


def scale_lm_head(trainer, factor: float) -> None:
    """Multiply the (base) lm_head of a trainer's policy by `factor` in place: a deliberate error."""
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.no_grad():
        base.get_output_embeddings().weight.mul_(factor)
