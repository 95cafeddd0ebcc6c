"""DPO: TRL's DPOTrainer (every `loss_type` and combination with `loss_weights`, `precompute_ref_log_probs`), patched.

Patched (see preference_common): the fused log-prob head that `trl.trainer.dpo_trainer` imports by name (slimrl's
scores only completion tokens in bounded tiles; the policy asks for log_probs, entropy, mean_logits, is_top1 and,
with `use_weighting`, log_sum_sq_probs, all of which slimrl's head returns), the config's `slimrl_num_chunks` field,
precision resolution and checks, the model checks and checkpointing mode at trainer set-up, the `peak_memory_gb`
metric. The chunking knob is on the policy before TRL's `__init__`, so a `precompute_ref_log_probs=True` pass (run
inside it) uses it too; a reference model TRL loads itself gets the knob right after.

TRL's own: `_compute_loss` (every loss, f-divergence, LD-DPO, WPO weighting, metrics), the reference pass (PEFT
adapter disabled or `ref_model`), `_precompute_ref_logps` and its cache, the data collator, `activation_offloading`.
"""

from .preference_common import preference_trainer_patches
from .registry import register
from .shared_prefix import dpo_shared_prefix_patches

for _patch in preference_trainer_patches(
    "dpo", "trl.trainer.dpo_trainer.DPOTrainer", "trl.trainer.dpo_config.DPOConfig",
    ("self", "model", "ref_model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
    fused_head_module="trl.trainer.dpo_trainer",
) + dpo_shared_prefix_patches():
    register(_patch)
