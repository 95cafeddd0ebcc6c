"""KTO: TRL's (stable) KTOTrainer, `loss_type` "kto" and "apo_zero_unpaired", `precompute_ref_log_probs`, patched.

Patched (offline.py): the fused log-prob head that `trl.trainer.kto_trainer` imports by name (policy: log_probs,
entropy, mean_logits; reference: log_probs), the config's `slimrl_num_chunks`, precision and checks, the trainer
set-up, the `peak_memory_gb` metric. All of KTO's forwards (policy, the no-grad KL forward on mismatched pairs,
reference and reference-KL, or their precomputed pass inside TRL's `__init__`) go through the patched head with the
knob already set.
TRL's own: `_compute_loss` (desirable/undesirable weights, KL estimate, metrics), `_compute_kl_logps`,
`compute_ref_log_probs`, `_precompute_ref_logps`, the collators and sampler, `activation_offloading`.
"""

from .offline import offline_patches

PATCHES = offline_patches(
    "kto",
    "trl.trainer.kto_trainer.KTOTrainer",
    "trl.trainer.kto_config.KTOConfig",
    ("self", "model", "ref_model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
    fused_head_module="trl.trainer.kto_trainer",
)
