"""RLOO: TRL's RLOOTrainer, patched like GRPO (same seams: fused log-prob head, rollouts, config, training step).

RLOO computes the old-policy log-probs with an extra no-grad forward and applies the KL as a reward penalty; both go
through the same patched head, so their numbers are TRL's.
"""

from .registry import register
from .rl_common import rl_trainer_patches

for _patch in rl_trainer_patches(
    "rloo", "trl.trainer.rloo_trainer", "RLOOTrainer", "trl.trainer.rloo_config", "RLOOConfig"
):
    register(_patch)
