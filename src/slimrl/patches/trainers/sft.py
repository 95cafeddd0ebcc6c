"""SFT: TRL's SFTTrainer (language modelling, prompt-completion with `completion_only_loss`, `loss_type` "nll" and
"dft"), patched.

Patched (offline.py): the fused log-prob head that `trl.trainer.sft_trainer` imports by name (outputs log_probs,
entropy, is_top1; labels -100 on prompt and padding, so slimrl's head scores only the trained tokens), the config's
`slimrl_num_chunks`, precision and checks, the trainer set-up, the `peak_memory_gb` metric.
TRL's own: `compute_loss` (token-sum / `num_items_in_batch` normalisation, DFT, label smoothing and
`compute_loss_func`, which take full logits from the unpatched forward), the metrics, dataset preparation and packing,
`activation_offloading`.
"""

from .offline import offline_patches

PATCHES = offline_patches(
    "sft",
    "trl.trainer.sft_trainer.SFTTrainer",
    "trl.trainer.sft_config.SFTConfig",
    ("self", "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
    fused_head_module="trl.trainer.sft_trainer",
)
