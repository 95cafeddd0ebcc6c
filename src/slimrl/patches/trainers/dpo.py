"""DPO: TRL's DPOTrainer (every `loss_type` and combination with `loss_weights`, `precompute_ref_log_probs`), patched.

Patched (offline.py): the fused log-prob head that `trl.trainer.dpo_trainer` imports by name (slimrl's scores only
completion tokens in bounded chunks; the policy asks for log_probs, entropy, mean_logits, is_top1 and, with
`use_weighting`, log_sum_sq_probs, all of which slimrl's head returns), the config's `slimrl_num_chunks` and
`slimrl_shared_prefix`, precision and checks, the trainer set-up (the knob is on the policy before TRL's `__init__`,
so a `precompute_ref_log_probs=True` pass run inside it uses it too; a reference TRL loads itself gets it right after),
the `peak_memory_gb` metric. Shared-prefix forwards (shared_prefix.py): `_compute_loss` and `compute_ref_log_probs`
run inside a context in which chosen and rejected rows forward their common prompt once. `_prepare_dataset`: the
tokenized prompts cut to `max_prompt_length` (prompt_limit.py) when it is set.
TRL's own: `_compute_loss` (every loss, f-divergence, LD-DPO, WPO weighting, metrics), the reference pass (PEFT
adapter disabled or `ref_model`), `_precompute_ref_logps` and its cache, the data collator, `activation_offloading`.
"""

from ..scoring.shared_prefix import DPO_PATCHES
from ..seams import Patch
from ..setup import prompt_limit
from .offline import SHARED_PREFIX_OFFLINE, offline_patches

PATCHES = [
    *offline_patches(
        "dpo",
        "trl.trainer.dpo_trainer.DPOTrainer",
        "trl.trainer.dpo_config.DPOConfig",
        ("self", "model", "ref_model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class"),
        fused_head_module="trl.trainer.dpo_trainer",
        family=SHARED_PREFIX_OFFLINE,
    ),
    *DPO_PATCHES,
    Patch(
        "trl.trainer.dpo_trainer.DPOTrainer",
        "_prepare_dataset",
        ("self", "dataset", "processing_class", "args", "dataset_name"),
        prompt_limit.make_prepare_dataset,
        "max_prompt_length: tokenized prompts keep their last tokens",
    ),
]
