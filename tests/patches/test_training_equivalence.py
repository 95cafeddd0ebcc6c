"""Training-level properties of the patched trainers, each checked through `trainer.train()`.

1. Every trainable parameter changes after one patched step (TRL's test style: clone before `train()`), for LoRA
   (frozen base weights must not change) and full fine-tuning, GRPO and RLOO.
2. Batch 4 × accumulation 1 ≡ batch 1 × accumulation 4 (same generation batch of 4 rows, same rollouts): the same
   logged loss and the same accumulated gradient at the optimizer step (read by a callback: comparing parameter
   updates instead would measure float32 rounding of the parameters). In stock TRL 1.16 this holds for
   grpo/sapo (per-sequence mean, then batch mean ÷ accumulation), dr_grpo (÷ B·max_completion_length ÷ accumulation),
   dapo/cispo/vespo (÷ the generation batch's token count, rescaled by accumulation / steps_per_generation),
   luspo (per-sequence sum, batch mean ÷ accumulation) and RLOO (sequence mean; HF divides by accumulation).
   It does NOT hold for bnpo (token mean of each micro-batch ÷ accumulation weights micro-batches equally, not
   tokens): there the test asserts that stock TRL differs between the geometries (the completions have unequal
   lengths) and that the patched trainer equals stock in each geometry.
"""

import pytest

try:
    from . import _parity as P
except ImportError:  # tests/patches is not a package
    import _parity as P

from transformers import TrainerCallback

torch = P.torch
GEOMETRY_RTOL = P.RTOL  # one batch vs four accumulated micro-batches: same sums, different order (measured <= 1e-6)





def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("algorithm,lora", [("grpo", True), ("grpo", False), ("rloo", True), ("rloo", False)])
def test_every_trainable_parameter_changes(tmp_path, unpatched, saved_model, algorithm, lora):
    # Full fine-tuning runs with a reference reloaded from disk (RLOO's default beta=0.05; GRPO beta set > 0)
    factory = (lambda: P.tiny_model(0)) if lora else (lambda: P.load_tiny(saved_model))
    config = dict(max_steps=1, learning_rate=1e-2, beta=0.04, per_device_train_batch_size=4, num_generations=2)
    with P.patched_state(algorithm):
        args = P.make_config(algorithm, str(tmp_path), slimrl_num_chunks=3, **config)
        trainer = P.build_trainer(algorithm, factory(), args, P.lora_config() if lora else None)
        assert P.head_file(trainer).endswith("slimrl/ops/logprob.py")
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


def _train(algorithm, loss_type, batch, accumulation, patched, output_dir):
    """One optimizer step through `train()`; returns (trainer, logged loss, step gradient of every trainable)."""
    config = dict(max_steps=1, learning_rate=1e-2, beta=0.04, per_device_train_batch_size=batch,
                  gradient_accumulation_steps=accumulation, num_generations=2, max_completion_length=7)
    if algorithm == "grpo":
        config["loss_type"] = loss_type
        config["importance_sampling_level"] = "sequence" if loss_type == "luspo" else "token"
    with P.patched_state(algorithm) if patched else P.stock_state():
        extra = {"slimrl_num_chunks": 3} if patched else {}
        args = P.make_config(algorithm, output_dir, **config, **extra)
        trainer = P.build_trainer(algorithm, P.tiny_model(0), args, P.lora_config())
        probe = _GradientAtOptimizerStep()
        trainer.add_callback(probe)
        trainer.train()
    assert probe.grads, "no gradient reached the optimizer step"
    return trainer, P.logged(trainer, "loss")[0], probe.grads


def _assert_same_step(a, b, rtol, what):
    (_, loss_a, grads_a), (_, loss_b, grads_b) = a, b
    assert loss_b == pytest.approx(loss_a, rel=rtol, abs=1e-7), f"{what}: logged loss"
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        P.assert_close_rel(grads_b[name], grads_a[name], f"{what}: gradient of {name}", rtol)


def _all_runs(algorithm, loss_type, tmp_path):
    return {(patched, geo): _train(algorithm, loss_type, *geo, patched, str(tmp_path / f"{patched}-{geo[0]}x{geo[1]}"))
            for patched in (False, True) for geo in ((4, 1), (1, 4))}


EQUIVALENT = [("grpo", t) for t in ("grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")] + [("rloo", None)]


@pytest.mark.parametrize("algorithm,loss_type", EQUIVALENT, ids=[t or a for a, t in EQUIVALENT])
def test_accumulation_equivalence(tmp_path, unpatched, algorithm, loss_type):
    runs = _all_runs(algorithm, loss_type, tmp_path)
    # Stock TRL holds the equivalence ...
    _assert_same_step(runs[False, (4, 1)], runs[False, (1, 4)], GEOMETRY_RTOL, "stock 4x1 vs 1x4")
    # ... and so does the patched trainer, matching stock in each geometry
    _assert_same_step(runs[True, (4, 1)], runs[True, (1, 4)], GEOMETRY_RTOL, "patched 4x1 vs 1x4")
    for geo in ((4, 1), (1, 4)):
        _assert_same_step(runs[False, geo], runs[True, geo], P.RTOL, f"stock vs patched {geo}")


def test_bnpo_accumulation_matches_stock_where_stock_differs(tmp_path, unpatched):
    runs = _all_runs("grpo", "bnpo", tmp_path)
    stock_lengths = P.logged(runs[False, (4, 1)][0], "completions/min_length") + P.logged(
        runs[False, (4, 1)][0], "completions/max_length")
    assert stock_lengths[0] != stock_lengths[1], "completions of equal length would make bnpo equivalent"
    with pytest.raises(AssertionError):  # stock TRL: each micro-batch's token mean weighs micro-batches equally
        _assert_same_step(runs[False, (4, 1)], runs[False, (1, 4)], 1e-3, "stock bnpo 4x1 vs 1x4")
    for geo in ((4, 1), (1, 4)):
        _assert_same_step(runs[False, geo], runs[True, geo], P.RTOL, f"bnpo stock vs patched {geo}")
