"""Reward modelling: TRL's RewardTrainer, patched for set-up, checks and the memory metric only.

RewardTrainer trains an `AutoModelForSequenceClassification` (one score per sequence from the last token's hidden
state): there is no LM head and no per-token log-prob to compute, so there is no head seam to replace and
`slimrl_num_chunks` has nothing to chunk (accepted, and warned about when set).
Patched (offline.py): the config's `slimrl_num_chunks`, precision and checks, the trainer set-up (`max_length` vs the
model's `max_seq_length`, precision vs weights, checkpointing mode), the `peak_memory_gb` metric.
TRL's own: `compute_loss` (Bradley-Terry loss, margin, `center_rewards_coefficient`), the metrics, dataset preparation,
`activation_offloading`.
"""

from .offline import offline_patches

PATCHES = offline_patches(
    "reward",
    "trl.trainer.reward_trainer.RewardTrainer",
    "trl.trainer.reward_config.RewardConfig",
    ("self", "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
)
