"""GRPO and its loss variants (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo): TRL's GRPOTrainer, patched.

Patched (online.py): the log-prob head (slimrl.ops.logprob), the config fields and checks, the trainer set-up
(trainer_setup.py), the mode switching around rollouts, rollouts on the model's vLLM engine, the peak-memory metric,
the rows of a step scored in groups with padding-free forwards and tiled MLPs (row_groups.py); (multiturn.py) the
length check of the turns after a tool call.
TRL's own: `_compute_loss` (every loss type, importance-sampling level and KL option, run once per row group),
generation, the tool loop, environments and `rollout_func`, rewards, advantages, buffering, metrics.
"""

from ..rollouts.multiturn import multiturn_patches
from .online import online_patches

PATCHES = [
    *online_patches("grpo", "trl.trainer.grpo_trainer", "GRPOTrainer", "trl.trainer.grpo_config", "GRPOConfig"),
    *multiturn_patches("trl.trainer.grpo_trainer.GRPOTrainer"),
]
