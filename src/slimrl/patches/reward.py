"""Reward modelling: TRL's RewardTrainer, patched for set-up, checks and the memory metric only.

RewardTrainer trains an `AutoModelForSequenceClassification` (one score per sequence from the last token's hidden
state): there is no LM head and no per-token log-prob to compute, so there is no fused-head seam to replace and
`slimrl_num_chunks` has nothing to chunk (accepted, and warned about when set). Patched (see preference_common): the
config's `slimrl_num_chunks` field, precision resolution and checks, the model checks (`max_length` vs the model's
`max_seq_length`, precision vs weights) and checkpointing mode at set-up, the `peak_memory_gb` metric.

TRL's own: `compute_loss` (Bradley-Terry loss, margin, `center_rewards_coefficient`), the metrics, dataset preparation,
`activation_offloading`.
"""

from .preference_common import preference_trainer_patches
from .registry import register

for _patch in preference_trainer_patches(
    "reward", "trl.trainer.reward_trainer.RewardTrainer", "trl.trainer.reward_config.RewardConfig",
    ("self", "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
):
    register(_patch)
