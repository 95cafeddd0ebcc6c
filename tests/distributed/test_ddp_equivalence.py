"""2 CPU processes under DDP (torchrun, gloo) ≡ 1 process at twice the per-device batch, for patched GRPO and DPO.

The claim: data parallelism changes how the batch is split, not what is computed. The 2-process run at per-device
batch 2 and the 1-process run at batch 4 see the same rows per optimizer step (same seed: same data order; GRPO's
completions replayed, see _dist_worker), so their losses, step gradients and final LoRA weights must agree up to
float32 rounding of sums taken in another order (each rank's partial mean, then gloo's all-reduce, against one
GEMM over the whole batch). How much rounding that is depends on the CPU and on each quantity's conditioning, so the
tolerance is _parity's rule with the 1-process float32 run in stock's place:
    e(2 processes) <= K e(1 process) + F e(perturbed) + F u |reference|,
e against a float64 1-process run of stock TRL (the naive float64 head) on the same replayed rows. The logged loss
has one more rounding only the 2-process run has: it is the float32 average of per-rank float32 losses, each rounded
to u |l_rank| although their average may cancel to much less: (world + 1) u sum|l_rank| / world is added to its floor.

Also checked: slimrl resolved use_cpu (world 2; stock TRL fails on the same script, the negative control of that
resolution), both ranks end with bitwise-equal weights (DDP kept them in sync), every gradient-carrying call of
slimrl's log-prob head ran inside the DDP wrapper's forward and every call inside the model's own forward (the
module hooks FSDP and ZeRO-3 rely on fire), with the full [V, H] head weight, and a 0.1% error in the 2-process
gradients fails the comparison (negative control).

The same under DeepSpeed ZeRO-2 and ZeRO-3 on CPU (DeepSpeed's CPU accelerator, gloo; ZeRO-3 partitions even the
tiny head, which slimrl's head then reads inside the model's forward, where DeepSpeed gathers it), when deepspeed is
installed (scripts/install_deepspeed.sh; skipped with that reason otherwise).

Tier: `distributed` (scripts/test_distributed.sh).
"""

import pytest
import torch

import _dist_worker as W
import _parity as P
from _launch import ROOT, torchrun

pytestmark = pytest.mark.distributed
WORKER = ROOT / "tests/distributed/_dist_worker.py"
WORLD, PER_DEVICE_BATCH = 2, 2
REFERENCE_SIDES = ("patched", *P.FLOAT64_SIDES)  # the 1-process runs: float32 patched, float64 stock (x3)


def _two_processes(algorithm, tmp_path, zero=None) -> dict:
    out = tmp_path / f"{algorithm}-2proc.pt"
    torchrun(WORKER, algorithm, "patched", PER_DEVICE_BATCH, out, *(() if zero is None else ("--zero", zero)))
    return torch.load(out, weights_only=False)


def _one_process(algorithm, tmp_path, replay) -> P.Sides:
    runs = {
        side: W.run(algorithm, side, WORLD * PER_DEVICE_BATCH, str(tmp_path / side), replay=replay)
        for side in REFERENCE_SIDES
    }
    return P.Sides(stock=None, **runs)


def _loss_floor(rank_losses) -> float:
    """Rounding of a float32 average of per-rank float32 losses (see the module docstring)."""
    return (WORLD + 1) * P.U32 * sum(abs(x) for x in rank_losses) / WORLD


def _refs(one: P.Sides) -> tuple:
    """The 1-process sides in _parity.check's order: float32 (stock's place), reference, the perturbed draws."""
    return (one.patched, one.reference, *(getattr(one, side) for side in P.PERTURBATION_SEEDS))


def _compare(two, one: P.Sides) -> None:
    """_parity's rule for every step loss, step gradient and final weight."""
    refs = _refs(one)
    assert len(two["losses"]) == len(one.patched["losses"]) == len(two["grads"]) > 0
    for i, loss in enumerate(two["losses"]):
        rank_losses = [losses[i] for losses in two["rank_micro_losses"]]
        P.check(f"step {i}: logged loss", loss, *(r["losses"][i] for r in refs), extra_floor=_loss_floor(rank_losses))
    for i, grads in enumerate(two["grads"]):
        assert grads.keys() == one.reference["grads"][i].keys()
        for name, grad in grads.items():
            P.check(f"step {i}: gradient of {name}", grad, *(r["grads"][i][name] for r in refs))
    for name, param in two["params"].items():
        P.check(f"final {name}", param, *(r["params"][name] for r in refs))


def _assert_head_ran_inside_root(two) -> None:
    for rank, calls in enumerate(two["rank_head_calls"]):
        assert calls, f"rank {rank}: slimrl's head never ran"
        for with_grad, in_root, in_model, weight_type, shape in calls:
            assert in_model, f"rank {rank}: a head call outside the model's forward (module hooks skipped)"
            assert in_root or not with_grad, f"rank {rank}: a gradient-carrying head call outside DDP's forward"
            assert shape == (W.T.VOCAB, W.T.HIDDEN), f"rank {rank}: head weight {weight_type} {shape} not gathered"
        assert any(c[0] for c in calls), f"rank {rank}: no training forward went through the head"


CASES = [("grpo", None), ("dpo", None), ("grpo", 2), ("grpo", 3), ("dpo", 3)]


@pytest.mark.parametrize("algorithm,zero", CASES, ids=[f"{a}-ddp" if z is None else f"{a}-zero{z}" for a, z in CASES])
def test_two_processes_equal_one_at_twice_the_batch(tmp_path, unpatched, algorithm, zero):
    if zero is not None:
        pytest.importorskip(
            "deepspeed",
            reason="DeepSpeed is not installed: bash scripts/install_deepspeed.sh, then "
            "run the tier with .venv-deepspeed/bin/python",
        )
    two = _two_processes(algorithm, tmp_path, zero)
    assert (two["world_size"], two["use_cpu"]) == (WORLD, True), "use_cpu was not resolved for 2 CPU processes"
    ranks = two["rank_params"]
    assert all(torch.equal(ranks[0][n], r[n]) for r in ranks[1:] for n in ranks[0]), "ranks ended out of sync"
    _assert_head_ran_inside_root(two)
    one = _one_process(algorithm, tmp_path, replay=two["rollouts"] if algorithm == "grpo" else None)
    _compare(two, one)
    for name, grad in two["grads"][0].items():  # negative control: a 0.1% error in any gradient fails
        with pytest.raises(AssertionError, match="patched - ref"):
            P.check(f"control {name}", grad * 1.001, *(r["grads"][0][name] for r in _refs(one)))


def test_stock_trl_needs_use_cpu_for_two_cpu_processes(tmp_path):
    """The scenario slimrl's use_cpu resolution fixes: stock TRL, same script, same launch, fails in its config."""
    done = torchrun(WORKER, "grpo", "stock", PER_DEVICE_BATCH, tmp_path / "stock.pt", check=False)
    assert done.returncode != 0
    assert "must be divisible by num_generations" in done.stdout, done.stdout[-3000:]
