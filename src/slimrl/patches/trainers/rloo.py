"""RLOO: TRL's RLOOTrainer, patched like GRPO (same seams: log-prob head, rollouts, config, set-up, training step).

Patched (online.py): as GRPO. TRL's own: the extra no-grad old-policy forward and the KL reward penalty (both go
through the patched head, so their numbers are TRL's), the leave-one-out baseline, the loss, metrics.
"""

from .online import online_patches

PATCHES = online_patches("rloo", "trl.trainer.rloo_trainer", "RLOOTrainer", "trl.trainer.rloo_config", "RLOOConfig")
