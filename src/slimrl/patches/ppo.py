"""PPO: TRL 1.16 ships no PPO trainer; `PatchFastRL("ppo")` makes `from trl import PPOConfig, PPOTrainer` give
slimrl's (slimrl.ppo), for Unsloth-style scripts written against TRL's old `trl.PPOTrainer`.

Choices:
- Two registered `creates` patches (module-symbol assignments on `trl`, like ORPO's aliases): checked at patch
  time, reversible (`unpatch()` deletes them), and skipped where a TRL defines these names itself (that TRL's own
  classes are then left alone).
- Nothing of TRL is overridden: slimrl's PPOTrainer is a whole trainer built on TRL's `_BaseTrainer`, already on
  slimrl's memory paths, so there is no other seam to patch.
"""

from __future__ import annotations

from .orpo import alias_patches
from .registry import register  # only for the registration block at the end

PATCHES = alias_patches("ppo", "slimrl.ppo", ("PPOConfig", "PPOTrainer"))

# --- registration the current way (registry.register at import); the declarative registry reads PATCHES instead ---
for _patch in PATCHES:
    register(_patch)
