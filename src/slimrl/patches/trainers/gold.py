"""GOLD: TRL 1.16's experimental GOLDTrainer (`trl.experimental.gold`: generalized JSD with `beta` and `temperature`,
on-policy fraction `lmbda` with buffered rollouts, HF or vLLM generation), patched to never hold either model's
`[B, T, V]` logits.

Patched: `GOLDTrainer.compute_loss` (distill_loss.py, declared below: the divergence at `temperature`, the batch's
extra model inputs passed to both models as stock does); the set-up shared with SFT (offline.py) and the teacher
check; `use_uld_loss=True` refused at config time naming the option (distill_setup.py).
TRL's own: `_prepare_inputs` / `_fill_buffer` (the on-policy draw, generation), `training_step` and its on/off-policy
loss logging, `prediction_step`, the collators, vLLM generation.
"""

from ..scoring.distill_loss import COMPUTE_LOSS_PARAMS, DistillLoss, compute_loss_maker
from ..seams import Patch
from .distill_setup import GOLD_DISTILL
from .offline import offline_patches

TRAINER = "trl.experimental.gold.gold_trainer.GOLDTrainer"
TRAINER_PARAMS = ("self", "model", "teacher_model", "args", "data_collator", "train_dataset", "eval_dataset")

GOLD = DistillLoss(
    name="GOLDTrainer",
    temperature=lambda trainer: trainer.temperature,
    forward_kwargs=lambda trainer, inputs: trainer._get_model_forward_kwargs(inputs),
)

PATCHES = [
    Patch(
        TRAINER,
        "compute_loss",
        COMPUTE_LOSS_PARAMS,
        compute_loss_maker(GOLD),
        "chunked divergence from both models' hidden states; no [B, T, V] logits",
        requires=(("trl.experimental.utils", "empty_cache", ()),),
    ),
    *offline_patches(
        "gold", TRAINER, "trl.experimental.gold.gold_config.GOLDConfig", TRAINER_PARAMS, family=GOLD_DISTILL
    ),
]
