"""Patched GRPO trains with a real tool (a calculator) and a small text environment (a number-guessing game).

`trainer.train()` end to end under `PatchFastRL("grpo")`, a few optimizer steps: the tool / the game's method is
called by the model and its result lands in the completions (TRL's `tools/call_frequency` > 0), the loss is finite and
the trained weights move. The tiny model of _multiturn.py (which writes tool calls on its own) runs in the default
tier; the embedded model (smollm2-135m) in the slow tier. SmolLM2's own chat template ignores `tools=` (TRL's
`supports_tool_calling` refuses it), so its runs use _multiturn.py's template and call syntax (`plus a 3 b 4`), taught
by the prompt; a game played through `rollout_func` (a plain-text protocol, no tool call) trains it too.
"""

from __future__ import annotations

import os

import pytest
import torch

from slimrl import PatchFastRL

import _multiturn as M
import _rl_parity as R


@pytest.fixture(autouse=True)
def _quiet_experimental(monkeypatch):
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")


def digit_reward(completions, **kwargs):
    """Rewards a completion whose text holds a digit (a tool result or an answer)."""
    return [float(any(ch.isdigit() for ch in str(c))) for c in completions]


def brevity_reward(completion_ids, **kwargs):
    """Rewards short completions (graded, so a group's rewards differ)."""
    return [-len(ids) / 10 for ids in completion_ids]


def _train(tmp_path, model, tokenizer, dataset, max_steps=2, reward=digit_reward, **trainer_kwargs):
    import trl

    PatchFastRL("grpo")
    args = R.make_config(
        "grpo", str(tmp_path), max_steps=max_steps, max_completion_length=24, per_device_train_batch_size=4
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        **trainer_kwargs,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    torch.manual_seed(0)
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == max_steps and all(torch.isfinite(torch.tensor(losses))), losses
    assert moved, "no trained weight moved"
    return trainer


def _logged(trainer, key: str) -> list[float]:
    return [log[key] for log in trainer.state.log_history if key in log]


def _tool_calls(trainer) -> float:
    return max(_logged(trainer, "tools/call_frequency"))


def test_tiny_calculator_tool_trains(tmp_path):
    trainer = _train(tmp_path, M.tool_model("plus"), M.tokenizer(), M.dataset(), tools=[M.plus])
    assert _tool_calls(trainer) > 0


def test_tiny_guessing_game_trains(tmp_path):
    trainer = _train(
        tmp_path, M.tool_model("answer"), M.tokenizer(), M.dataset(secrets=True), environment_factory=M.GuessingGame
    )
    assert _tool_calls(trainer) > 0
    assert len(_logged(trainer, "rewards/GuessingGame/mean")) == 2


# --- the embedded model --------------------------------------------------------------------------------------------

TEACH = "To add two digits, write the word plus and the digits, like: plus a 3 b 4 . "


def _embedded():
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", max_seq_length=512)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    tokenizer.chat_template = M.CHAT_TEMPLATE
    tokenizer.response_template = M.RESPONSE_TEMPLATE
    return model, tokenizer


def _questions(n: int = 8):
    from datasets import Dataset

    pairs = [(i % 5, (i * 3) % 5) for i in range(n)]
    return Dataset.from_dict({"prompt": [M.conversation(f"{TEACH}What is {a} plus {b} ?") for a, b in pairs]})


@pytest.mark.slow
def test_embedded_calculator_tool_trains(tmp_path):
    model, tokenizer = _embedded()
    trainer = _train(tmp_path, model, tokenizer, _questions(), max_steps=3, tools=[M.plus])
    assert _tool_calls(trainer) > 0, "the embedded model never called the calculator"


@pytest.mark.slow
def test_embedded_text_game_trains(tmp_path):
    model, tokenizer = _embedded()
    _train(
        tmp_path, model, tokenizer, _questions(), max_steps=3, reward=brevity_reward, rollout_func=M.text_game_rollout
    )
