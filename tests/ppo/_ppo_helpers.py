"""Tiny PPO set-ups for the tests: a random Llama whose output layer is scaled up (std 0.5) so that a LoRA on the
decoder can move the token distribution (at the default std 0.02 every logit is ~0 and no hidden state can change
that), a word-level tokenizer, prompts, and a reward the tiny model can learn in a few steps."""

from __future__ import annotations

import torch

VOCAB = 256
LOW_IDS = 64  # the reward: the fraction of response tokens with an id below this (about 0.25 at the start)


def tiny_policy(seed: int = 0, head_std: float = 0.5):
    from slimrl.testing import tiny_llama

    model = tiny_llama(seed=seed, vocab_size=VOCAB)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=generator) * head_std)
    return model


def tokenizer():
    from slimrl.testing import tiny_tokenizer

    return tiny_tokenizer(VOCAB)


def prompts(n: int = 64):
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": [f"what is {i} plus {i % 7}" for i in range(n)], "answer": [i + i % 7 for i in range(n)]}
    )


def low_id_reward(completion_ids, **kwargs):
    return [sum(t < LOW_IDS for t in ids) / max(len(ids), 1) for ids in completion_ids]


def lora_config(r: int = 8):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=16, target_modules="all-linear")


def ppo_config(output_dir, **overrides):
    from slimrl.ppo import PPOConfig

    settings = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "num_ppo_epochs": 2,
        "response_length": 4,
        "max_steps": 2,
        "logging_steps": 1,
        "report_to": [],
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "save_strategy": "no",
        "temperature": 1.0,
        "seed": 0,
        "disable_tqdm": True,
        "gradient_checkpointing": False,
    }
    settings.update(overrides)
    return PPOConfig(**settings)


def lora_trainer(output_dir, model=None, reward=low_id_reward, **overrides):
    from slimrl.ppo import PPOTrainer

    return PPOTrainer(
        args=ppo_config(output_dir, **overrides),
        processing_class=tokenizer(),
        model=model if model is not None else tiny_policy(),
        reward_model=reward,
        train_dataset=prompts(),
        peft_config=lora_config(),
    )


def logged(trainer, key: str) -> list[float]:
    return [row[key] for row in trainer.state.log_history if key in row]
