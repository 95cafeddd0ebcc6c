"""GRPO (and its loss variants: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo): TRL's GRPOTrainer, patched.

TRL's loss code (`_compute_loss`) runs unchanged, so every loss type, importance-sampling level and KL option keeps
TRL's exact math; slimrl changes only how the per-token log-probs are produced (see slimrl.ops.logprob) and the
set-up around them (see rl_common).
"""

from .registry import register
from .rl_common import rl_trainer_patches

for _patch in rl_trainer_patches(
    "grpo", "trl.trainer.grpo_trainer", "GRPOTrainer", "trl.trainer.grpo_config", "GRPOConfig"
):
    register(_patch)
