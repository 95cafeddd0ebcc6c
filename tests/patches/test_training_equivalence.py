"""Training-level properties of the patched trainers, each checked through `trainer.train()`.

1. Every trainable parameter changes after one patched step (TRL's test style: clone before `train()`), for LoRA
   (frozen base weights must not change) and full fine-tuning, GRPO and RLOO.
2. Batch 4 × accumulation 1 ≡ batch 1 × accumulation 4 (same generation batch of 4 rows, same rollouts): the same
   logged loss and the same accumulated gradient at the optimizer step (read by a callback: comparing parameter
   updates instead would measure float32 rounding of the parameters). The claim is about the arithmetic, so it is
   checked on the float64 reference runs (two geometries, same sums in another order: equal to ~1e-15); the
   float32 stock and patched runs of each geometry are compared by _parity's rule against that geometry's
   reference. In stock TRL 1.16 the equivalence holds for grpo/sapo (per-sequence mean, then batch mean ÷
   accumulation), dr_grpo (÷ B·max_completion_length ÷ accumulation), dapo/cispo/vespo (÷ the generation batch's
   token count, rescaled by accumulation / steps_per_generation), luspo (per-sequence sum, batch mean ÷
   accumulation) and RLOO (sequence mean; HF divides by accumulation). It does NOT hold for bnpo (token mean of
   each micro-batch ÷ accumulation weights micro-batches equally, not tokens): there the test asserts that the
   reference differs between the geometries (the completions have unequal lengths) and that the patched trainer
   equals stock in each geometry.
"""

import pytest
import torch
from transformers import TrainerCallback

import _parity as P
import _rl_parity as R
import _tiny as T

# float64 runs of two geometries: the same sums in another order, |difference| ~ 1e-16 x the terms' conditioning
# (measured 4e-16 on the step gradients)
FLOAT64_GEOMETRY_RTOL = 1e-9
# ... except the logged loss: transformers accumulates it in a float32 tensor (`_tr_loss`), so even the float64 runs
# log float32 numbers. Each of the GA additions rounds by at most u32 x (sum of |micro-step losses|), and the final
# conversion once more: |logged - exact| <= (GA + 1) u32 sum|l_i| (measured 4.2e-7 relative for GRPO; RLOO's
# on-policy loss cancels to ~1e-8 while its micro-step losses are ~0.1). Scalar additions round the same on every
# IEEE machine, so this bound does not depend on the CPU either.
GEOMETRIES = ((4, 1), (1, 4))


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("algorithm,lora", [("grpo", True), ("grpo", False), ("rloo", True), ("rloo", False)])
def test_every_trainable_parameter_changes(tmp_path, unpatched, saved_model, algorithm, lora):
    # Full fine-tuning runs with a reference reloaded from disk (RLOO's default beta=0.05; GRPO beta set > 0)
    factory = (lambda: T.tiny_model(0)) if lora else (lambda: T.load_tiny(saved_model))
    config = dict(max_steps=1, learning_rate=1e-2, beta=0.04, per_device_train_batch_size=4, num_generations=2)
    with P.patched_state(algorithm):
        args = R.make_config(algorithm, str(tmp_path), slimrl_num_chunks=3, **config)
        trainer = R.build_trainer(algorithm, factory(), args, T.lora_config() if lora else None)
        assert T.head_file(trainer).endswith("slimrl/ops/logprob.py")
        before = _snapshot(trainer.model)
        trainer.train()
    trainable = P.trainable(trainer.model)
    assert trainable and (not lora or all("lora_" in n for n in trainable))
    for name, param in trainer.model.named_parameters():
        if name in trainable:
            assert not torch.equal(param, before[name]), f"{name} did not change"
        else:
            assert torch.equal(param, before[name]), f"frozen {name} changed"


class _GradientAtOptimizerStep(TrainerCallback):
    """Clones every trainable gradient right before the optimizer step (the accumulated step gradient)."""

    def __init__(self):
        self.grads = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in P.trainable(model).items() if p.grad is not None}


def _train(algorithm, loss_type, batch, accumulation, side, output_dir):
    """One optimizer step through `train()`; returns (logged loss, step gradient of every trainable)."""
    config = dict(
        max_steps=1,
        learning_rate=1e-2,
        beta=0.04,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        num_generations=2,
        max_completion_length=7,
    )
    if algorithm == "grpo":
        config["loss_type"] = loss_type
        config["importance_sampling_level"] = "sequence" if loss_type == "luspo" else "token"
    with P.side_state(side, algorithm):
        args = R.make_config(algorithm, output_dir, **R.side_config(side, config, num_chunks=3))
        trainer = P.finish_side(
            side, R.build_trainer(algorithm, P.side_model(side, lambda: T.tiny_model(0)), args, T.lora_config())
        )
        probe = _GradientAtOptimizerStep()
        trainer.add_callback(probe)
        trainer.micro_losses = []
        step = trainer.training_step
        trainer.training_step = lambda *a, **k: trainer.micro_losses.append(float(out := step(*a, **k))) or out
        trainer.train()
    assert probe.grads, "no gradient reached the optimizer step"
    return T.logged(trainer, "loss")[0], probe.grads, trainer


def _logged_loss_bound(*runs) -> float:
    """Worst-case float32 rounding of each run's logged loss (see the note at the top), summed over the runs."""
    return sum((len(t.micro_losses) + 1) * P.U32 * sum(abs(x) for x in t.micro_losses) for _, _, t in runs)


def _all_runs(algorithm, loss_type, tmp_path):
    """{geometry: Sides of (logged loss, step gradients, trainer)} for both geometries."""
    return {
        geo: P.Sides(
            *(
                _train(algorithm, loss_type, *geo, side, str(tmp_path / f"{side}-{geo[0]}x{geo[1]}"))
                for side in P.Sides._fields
            )
        )
        for geo in GEOMETRIES
    }


def _float64_difference(a, b) -> tuple[float, float]:
    """(difference of the logged losses over its float32 logging bound, largest relative difference of a step
    gradient) of two float64 runs: both <= 1 and <= FLOAT64_GEOMETRY_RTOL where the geometries are equivalent."""
    (loss_a, grads_a, _), (loss_b, grads_b, _) = a, b
    assert grads_a.keys() == grads_b.keys()
    return abs(loss_a - loss_b) / _logged_loss_bound(a, b), max(P.rel_err(grads_b[n], grads_a[n]) for n in grads_a)


def _assert_patched_matches_stock(sides, what):
    P.check_sides(f"{what}: logged loss", P.Sides(*(loss for loss, _, _ in sides)))
    grads = P.Sides(*(g for _, g, _ in sides))
    assert all(g.keys() == grads.stock.keys() for g in grads)
    for name in grads.stock:
        P.check_sides(f"{what}: gradient of {name}", P.Sides(*(g[name] for g in grads)))


EQUIVALENT = [("grpo", t) for t in ("grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")] + [("rloo", None)]


@pytest.mark.parametrize("algorithm,loss_type", EQUIVALENT, ids=[t or a for a, t in EQUIVALENT])
def test_accumulation_equivalence(tmp_path, unpatched, algorithm, loss_type):
    runs = _all_runs(algorithm, loss_type, tmp_path)
    # The arithmetic holds the equivalence (float64 stock TRL) ...
    loss_diff, grad_diff = _float64_difference(runs[(4, 1)].reference, runs[(1, 4)].reference)
    assert loss_diff <= 1 and grad_diff <= FLOAT64_GEOMETRY_RTOL, (loss_diff, grad_diff)
    # ... and the patched trainer matches stock in each geometry
    for geo in GEOMETRIES:
        _assert_patched_matches_stock(runs[geo], f"stock vs patched {geo}")


def test_bnpo_accumulation_matches_stock_where_stock_differs(tmp_path, unpatched):
    runs = _all_runs("grpo", "bnpo", tmp_path)
    stock = runs[(4, 1)].stock[2]
    stock_lengths = T.logged(stock, "completions/min_length") + T.logged(stock, "completions/max_length")
    assert stock_lengths[0] != stock_lengths[1], "completions of equal length would make bnpo equivalent"
    # stock TRL: each micro-batch's token mean weighs micro-batches equally, so the geometries really differ
    loss_diff, grad_diff = _float64_difference(runs[(4, 1)].reference, runs[(1, 4)].reference)
    assert loss_diff > 100 and grad_diff > 1e-3, (loss_diff, grad_diff)
    for geo in GEOMETRIES:
        _assert_patched_matches_stock(runs[geo], f"bnpo stock vs patched {geo}")
