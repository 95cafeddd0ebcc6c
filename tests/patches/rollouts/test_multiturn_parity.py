"""Patched GRPOTrainer ≡ stock TRL 1.16 on multi-turn rollouts: `tools=`, `environment_factory`, `rollout_func`.

Same harness and rule as test_grpo_parity.py (six sides in lock-step, tests/patches/_parity.py), in the tiny
multi-turn world of _multiturn.py, where the model calls tools on its own. What each case adds:
- the rollouts hold tool calls, tool results inside the completions and turns after them: TRL's `tool_mask` (0 on
  tool-result / environment tokens) is compared exactly, and the losses, gradients and metrics by the parity rule,
  so the tool tokens leave the loss exactly as in stock;
- slimrl's shared-prefix forward is forced on (`slimrl_shared_prefix=True`): TRL's rows are still
  `[prompt | completion]` with the tool results inside the completion, so each prompt is forwarded once for its
  completions, multi-turn or not; each case checks the packed path ran;
- tools=: a calculator, LoRA, a reference (beta > 0), old log-probs (num_iterations 2);
- environment_factory: a guessing game whose method is the tool and whose `get_reward` is a reward source, full
  fine-tuning with gradient accumulation;
- rollout_func: a two-turn text protocol whose game reply is marked 0 in `env_mask`, with its sampling log-probs.
The environment case and the negative control are in the slow tier.
"""

import os

import pytest
import torch

from slimrl.patches.scoring.shared_prefix import shared_prefix_stats

import _multiturn as M
import _rl_parity as R

ALGO = "grpo"
FORCED_SHARING = {"slimrl_shared_prefix": True}


@pytest.fixture(autouse=True)
def _quiet_experimental(monkeypatch):
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")


def _run(tmp_path, word, config, trainer_kwargs, lora, secrets=False):
    trainers = R.build_sides(
        ALGO,
        lambda: M.tool_model(word),
        dict(config),
        str(tmp_path),
        peft_config=R.T.lora_config(lora_alpha=M.LORA_ALPHA) if lora else None,
        patched_config=FORCED_SHARING,
        trainer_kwargs=dict(tokenizer=M.tokenizer(), train_dataset=M.dataset(secrets=secrets), **trainer_kwargs),
    )
    gen_batch = M.generation_batch(trainers.stock.args, secrets)
    traces = R.run_sides(ALGO, trainers, gen_batch=gen_batch)
    R.assert_traces_match(traces)
    stats = shared_prefix_stats(trainers.patched)
    assert stats.shared_calls > 0 and stats.positions_forwarded < stats.positions_per_row_path, stats
    return trainers, traces


def _masked_tokens(trace) -> int:
    """Tool-result / environment tokens (inside the completion mask) left out of the loss by TRL's tool_mask."""
    return sum(int(((x["tool_mask"] == 0) & (x["completion_mask"] == 1)).sum()) for x in trace.inputs)


def test_tools_lora_reference_old_logprobs(tmp_path, unpatched):
    config = dict(
        beta=0.04, num_iterations=2, per_device_train_batch_size=6, num_generations=3, max_completion_length=24
    )
    trainers, traces = _run(tmp_path, "plus", config, dict(tools=[M.plus]), lora=True)
    assert _masked_tokens(traces.stock) > 0, "no tool result landed in a completion"
    assert max(trainers.stock._metrics["train"]["tools/call_frequency"]) > 0
    assert all("old_per_token_logps" in x and "ref_per_token_logps" in x for x in traces.stock.inputs)


@pytest.mark.slow  # the default tier trains an environment (test_multiturn_training.py)
def test_environment_factory_full_finetuning_accumulation(tmp_path, unpatched):
    config = dict(
        beta=0.0,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=20,
    )
    trainers, traces = _run(
        tmp_path, "answer", config, dict(environment_factory=M.GuessingGame), lora=False, secrets=True
    )
    assert _masked_tokens(traces.stock) > 0, "no game reply landed in a completion"
    rewards = trainers.stock._metrics["train"]["rewards/GuessingGame/mean"]
    assert rewards and min(rewards) < 0, "the game's own reward should have scored the tries"


def test_rollout_func_env_mask(tmp_path, unpatched):
    config = dict(beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2)
    trainers, traces = _run(tmp_path, "plus", config, dict(rollout_func=M.text_game_rollout), lora=True)
    reply = len(M.tokenizer()(M.FEEDBACK, add_special_tokens=False)["input_ids"])
    for x in traces.stock.inputs:
        assert int((x["tool_mask"] == 0).sum()) == reply * x["tool_mask"].shape[0]
        assert torch.all(x["sampling_per_token_logps"] <= 0)


@pytest.mark.slow
def test_negative_control_tool_tokens_in_the_loss(tmp_path, unpatched, monkeypatch):
    """The same tools case with the tool mask dropped on the patched side only (tool results trained on): fails."""
    from trl.trainer import grpo_trainer

    real = grpo_trainer.GRPOTrainer._compute_loss

    def unmasked(self, model, inputs):
        if "tool_mask" in inputs and getattr(self.args, "slimrl_shared_prefix", None) is True:
            inputs = {k: v for k, v in inputs.items() if k != "tool_mask"}
        return real(self, model, inputs)

    monkeypatch.setattr(grpo_trainer.GRPOTrainer, "_compute_loss", unmasked)
    config = dict(beta=0.0, per_device_train_batch_size=6, num_generations=3, max_completion_length=24)
    with pytest.raises(AssertionError, match="loss|grad"):
        _run(tmp_path, "plus", config, dict(tools=[M.plus]), lora=True)
