"""Patched GMPOTrainer ≡ stock TRL 1.16's experimental GMPOTrainer (a GRPOTrainer whose `_compute_loss` takes the
geometric mean of log-space-clipped token ratios): same rollouts, loss, gradients, metrics and parameters over
2 steps, on GRPO's harness (_rl_parity) and rule (_parity).

Cases: LoRA with a KL term (adapter-disabled reference) and reused rollouts (num_iterations=2: ratios != 1 and the
log-space clip acting on the second step), 3 chunks; full fine-tuning with the entropy mask, a narrow clip,
temperature != 1, gradient accumulation and automatic chunks. GMPOConfig takes slimrl's config fields only patched;
`PatchFastRL("gmpo")` shares GRPO's seams and `unpatch("gmpo")` leaves a patched GRPO alone.
"""

import pytest

from slimrl.patches import registry

import _harness as HS
import _rl_parity as R
import _tiny as T

ALGO = "gmpo"

DEFAULT_TIER = "lora-kl-iters2-chunks3"  # the case the default tier runs; the others are slow tier
CASES = {
    "lora-kl-iters2-chunks3": (
        True,
        3,
        dict(beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2),
    ),
    "full-entropymask-narrowclip-temp-ga2-auto": (
        False,
        -1,
        dict(
            beta=0.0,
            num_iterations=2,
            top_entropy_quantile=0.5,
            epsilon=0.05,
            temperature=0.7,
            gradient_accumulation_steps=2,
            per_device_train_batch_size=3,
            num_generations=3,
        ),
    ),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == DEFAULT_TIER else pytest.mark.slow) for c in CASES])
def test_gmpo_matches_stock(case, tmp_path, unpatched):
    lora, chunks, config = CASES[case]
    trainers = HS.tiny_sides(R.build_sides, ALGO, config, tmp_path, lora, chunks)
    assert T.head_file(trainers.patched).endswith("slimrl/ops/logprob.py")
    assert T.head_file(trainers.stock).endswith("trl/trainer/utils.py")
    traces = R.run_sides(ALGO, trainers)
    R.assert_traces_match(traces)
    clipped = trainers.stock._metrics["train"]["clip_ratio/region_mean"]
    assert max(clipped) > 0, "the second step should be off-policy enough for GMPO's clip to act"


def test_gmpo_config_takes_slimrl_fields_only_patched(tmp_path, unpatched):
    from trl.experimental.gmpo import GMPOConfig

    with pytest.raises(TypeError, match="slimrl_num_chunks"):
        GMPOConfig(output_dir=str(tmp_path), slimrl_num_chunks=3)
    registry.PatchFastRL(ALGO)
    args = GMPOConfig(output_dir=str(tmp_path), slimrl_num_chunks=3, use_cpu=True, bf16=False)
    assert args.slimrl_num_chunks == 3 and args.epsilon == 0.4  # GMPO's own default kept


def test_gmpo_shares_grpo_seams(unpatched):
    from trl import GRPOTrainer
    from trl.experimental.gmpo import GMPOConfig

    stock_init = GMPOConfig.__dict__["__init__"]
    registry.PatchFastRL("grpo")
    registry.PatchFastRL(ALGO)
    registry.unpatch(ALGO)
    assert GMPOConfig.__dict__["__init__"] is stock_init
    assert hasattr(GRPOTrainer.__dict__["__init__"], "__slimrl_seam__"), "GRPO must stay patched"
    registry.unpatch()
    assert not hasattr(GRPOTrainer.__dict__["__init__"], "__slimrl_seam__")
