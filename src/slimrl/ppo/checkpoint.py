"""What a PPO checkpoint adds to the HF Trainer's (weights, optimizer, scheduler, RNG, trainer state).

- `slimrl_ppo_value.safetensors` (every save): the critic's trainable weights (value adapter and head, or a value
  model's weights). A LoRA policy's PeftModel also writes the value adapter under `value/`, which the HF Trainer
  reloads; this file is the one owner of the critic's weights and is loaded after it.
- `slimrl_ppo_state.pt` (checkpoints only): the micro-step counter, the episode count, the rollout being trained on
  (its tensors: a checkpoint in the middle of the PPO epochs resumes on the same rollout) and the metrics not yet
  logged. Loaded with `weights_only=True`: plain tensors, numbers, lists and dicts only.
"""

from __future__ import annotations

import os

import torch

from ..training.checkpoint_checks import check_checkpoint
from .rollout import RolloutBatch
from .value import load_trainable_state, trainable_state

VALUE_WEIGHTS = "slimrl_ppo_value.safetensors"
PPO_STATE = "slimrl_ppo_state.pt"


def save_value_weights(folder: str, critic) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(trainable_state(critic), os.path.join(folder, VALUE_WEIGHTS), metadata={"format": "pt"})


def load_value_weights(folder: str, critic) -> None:
    from safetensors.torch import load_file

    path = os.path.join(folder, VALUE_WEIGHTS)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this checkpoint was not written by slimrl's PPOTrainer, so the "
            "value function cannot be restored."
        )
    load_trainable_state(critic, load_file(path))


def save_ppo_state(folder: str, step: int, episode: int, rollout: RolloutBatch | None, metrics: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    state = {
        "step": step,
        "episode": episode,
        "rollout": None if rollout is None else rollout.state_dict(),
        "metrics": {name: list(values) for name, values in metrics.items()},
    }
    torch.save(state, os.path.join(folder, PPO_STATE))


def load_ppo_state(folder: str, device):
    """(step, episode, rollout or None, unlogged metrics) from a checkpoint folder."""
    path = os.path.join(folder, PPO_STATE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: resume_from_checkpoint must point at a checkpoint written by "
            "slimrl's PPOTrainer (checkpoint-N in its output_dir)."
        )
    check_checkpoint(folder)  # every file whole before any is read (a damaged one named, nothing written)
    state = torch.load(path, map_location="cpu", weights_only=True)
    rollout = None if state["rollout"] is None else RolloutBatch.from_state_dict(state["rollout"], device)
    return state["step"], state["episode"], rollout, state["metrics"]
