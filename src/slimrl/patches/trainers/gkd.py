"""GKD: TRL 1.16's experimental GKDTrainer (`trl.experimental.gkd`: generalized JSD with `beta`, on-policy fraction
`lmbda`, `seq_kd`), patched to never hold either model's `[B, T, V]` logits.

Patched: `GKDTrainer.compute_loss` (distill_loss.py, declared below: the divergence at temperature 1.0, as stock
passes none; no extra model inputs); the set-up shared with SFT (offline.py: `slimrl_num_chunks`, precision,
checkpointing, `max_length`, the `peak_memory_gb` metric) and the teacher check (distill_setup.py). A teacher may be
`slimrl.base_as_teacher(model)`: the student's own base with the adapter disabled, one base in memory.
TRL's own: `training_step` (the on-policy draw with `random.random() <= lmbda`, student or teacher generation),
`generate_on_policy_outputs`, `generalized_jsd_loss` (still used by stock's path), the ChatML collator.
"""

from ..scoring.distill_loss import COMPUTE_LOSS_PARAMS, DistillLoss, compute_loss_maker
from ..seams import Patch
from .distill_setup import SFT_DISTILL
from .offline import offline_patches

TRAINER = "trl.experimental.gkd.gkd_trainer.GKDTrainer"
TRAINER_PARAMS = ("self", "model", "teacher_model", "args", "data_collator", "train_dataset", "eval_dataset")

GKD = DistillLoss(
    name="GKDTrainer",
    temperature=lambda trainer: 1.0,
    forward_kwargs=lambda trainer, inputs: {},
)

PATCHES = [
    Patch(
        TRAINER,
        "compute_loss",
        COMPUTE_LOSS_PARAMS,
        compute_loss_maker(GKD),
        "chunked divergence from both models' hidden states; no [B, T, V] logits",
        requires=(("trl.experimental.utils", "empty_cache", ()),),
    ),
    *offline_patches("gkd", TRAINER, "trl.experimental.gkd.gkd_config.GKDConfig", TRAINER_PARAMS, family=SFT_DISTILL),
]
