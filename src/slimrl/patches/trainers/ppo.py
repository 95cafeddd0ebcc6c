"""PPO: TRL 1.16 ships no PPO trainer; `PatchFastRL("ppo")` makes `from trl import PPOConfig, PPOTrainer` give
slimrl's own (slimrl.ppo), for Unsloth-style scripts written against TRL's old `trl.PPOTrainer`.

Patched: nothing of TRL is overridden. Two `creates` patches add the module symbols `trl.PPOConfig` /
`trl.PPOTrainer` (reversible: unpatch deletes them; a TRL that defines these names itself is left alone), like
ORPO's aliases.
TRL's own: everything slimrl's PPOTrainer runs on, which is a whole trainer on TRL's `_BaseTrainer` (the HF Trainer
loop, optimizer, scheduler, logging, checkpoints), already on slimrl's memory paths, so there is no seam to patch.
"""

from ..seams import alias_patches

PATCHES = alias_patches("slimrl.ppo", ("PPOConfig", "PPOTrainer"))
