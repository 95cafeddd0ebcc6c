"""GMPO: TRL 1.16's experimental GMPOTrainer (`trl.experimental.gmpo`), a GRPOTrainer whose only change is
`_compute_loss` (the geometric mean of token ratios clipped in log space), patched through GRPO's seams.

Patched: every GRPO seam (online.py; GMPOTrainer inherits them, so `PatchFastRL("gmpo")` applies GRPO's list, shared
with "grpo" and kept while either is patched): the log-prob head (GMPO's `_compute_loss` calls GRPO's
`_get_per_token_logps_and_entropies`), rollouts and the model's vLLM engine, shared-prefix forwards, the set-up and
checks, the training step and the rollout buffer in checkpoints; and `GMPOConfig.__init__` (its dataclass
`__init__` does not run GRPOConfig's), so slimrl's config fields are accepted by GMPOConfig too.
TRL's own: GMPO's `_compute_loss` (log-space clipping, the geometric mean, the optional KL, its clip metrics).
"""

from ..seams import Patch
from ..setup.trainer_setup import config_init_maker
from .grpo import PATCHES as GRPO_PATCHES
from .online import ONLINE

CONFIG = "trl.experimental.gmpo.gmpo_config.GMPOConfig"

PATCHES = [
    *GRPO_PATCHES,
    Patch(CONFIG, "__init__", ("self", "output_dir"), config_init_maker(ONLINE), "accept slimrl's GRPO config fields"),
]
