"""Classic PPO (policy + learned critic) on one base model: `PPOConfig`, `PPOTrainer`. Imports TRL when used."""

from .config import PPOConfig
from .trainer import PPOTrainer

__all__ = ["PPOConfig", "PPOTrainer"]
