"""Resuming a PPO run from a checkpoint continues it exactly: N steps straight equal N/2 + save + resume (same seed)
in every logged loss and metric and in the final weights of both adapters and the value head; mid-rollout (inside
the PPO epochs of one rollout) and at a rollout boundary. Negative control: a 0.1% change to the saved rollout
makes the resumed run differ (so the comparison can fail, and the saved PPO state is what it resumes from)."""

import os

import pytest
import torch

from slimrl.ppo.checkpoint import PPO_STATE

from _ppo_helpers import lora_trainer

COMPARED = (
    "loss",
    "grad_norm",
    "loss/policy_avg",
    "loss/value_avg",
    "policy/approxkl_avg",
    "val/ratio",
    "objective/scores",
    "objective/kl",
    "policy/entropy_avg",
)


def _run(output_dir, resume_from=None, save_steps=None):
    extra = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else {}
    trainer = lora_trainer(output_dir, max_steps=6, **extra)  # 3 rollouts x 2 PPO epochs
    trainer.train(resume_from_checkpoint=resume_from)
    rows = {
        row["step"]: {k: row[k] for k in COMPARED if k in row} for row in trainer.state.log_history if "loss" in row
    }
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    weights.update({f"head.{n}": p.detach().clone() for n, p in trainer.ppo.critic.head.named_parameters()})
    return rows, weights


def _assert_same_run(rows_a, weights_a, rows_b, weights_b, steps):
    for step in steps:
        assert rows_a[step].keys() == rows_b[step].keys(), step
        for key, value in rows_a[step].items():
            assert rows_b[step][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        torch.testing.assert_close(weights_b[name], tensor, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("resume_at", [3, 4], ids=["mid-rollout", "rollout-boundary"])
def test_resume_equals_the_straight_run(tmp_path, resume_at):
    straight_rows, straight_weights = _run(tmp_path / "straight", save_steps=resume_at)
    checkpoint = tmp_path / "straight" / f"checkpoint-{resume_at}"
    assert (checkpoint / PPO_STATE).is_file() and (checkpoint / "slimrl_ppo_value.safetensors").is_file()
    rows, weights = _run(tmp_path / "resumed", resume_from=str(checkpoint))
    assert sorted(rows) == list(range(1, 7))  # the log history up to the checkpoint comes back with it
    resumed_steps = range(resume_at + 1, 7)
    _assert_same_run(straight_rows, straight_weights, rows, weights, resumed_steps)
    if resume_at != 3:
        return
    # negative control: the rollout the checkpoint carries, changed by 0.1%, changes what the resumed run logs
    state = torch.load(checkpoint / PPO_STATE, weights_only=True)
    state["rollout"]["advantages"] = state["rollout"]["advantages"] * 1.001
    torch.save(state, checkpoint / PPO_STATE)
    rows, weights = _run(tmp_path / "control", resume_from=str(checkpoint))
    with pytest.raises(AssertionError):
        _assert_same_run(straight_rows, straight_weights, rows, weights, resumed_steps)


def test_resume_from_a_folder_without_ppo_state_names_the_problem(tmp_path):
    folder = tmp_path / "checkpoint-1"
    os.makedirs(folder)
    trainer = lora_trainer(tmp_path / "run", max_steps=2)
    with pytest.raises(FileNotFoundError, match="written by slimrl's PPOTrainer"):
        trainer.train(resume_from_checkpoint=str(folder))
