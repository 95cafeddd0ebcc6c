"""The tiny world every parity test runs in: a random 2-layer Llama, a word-level tokenizer, prompts, LoRA config.

The EOS row of the LM head is scaled up so random models stop at varied lengths: completions get right padding,
truncated and finished rows mix (mask_truncated_completions has work to do). Prompts have different lengths, so
every batch mixes left-padding amounts.
"""

from __future__ import annotations

import torch

from slimrl.testing import tiny_llama, tiny_tokenizer

VOCAB, HIDDEN, LAYERS = 512, 32, 2
EOS_ID = 2
# the training arguments every offline/online parity harness shares (each adds its trainer's own fields)
PARITY_CONFIG = dict(
    bf16=False,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    per_device_train_batch_size=3,
    learning_rate=1e-2,
    gradient_checkpointing=False,
    seed=0,
    dataloader_pin_memory=False,
)
EOS_BOOST = 40.0  # scales the EOS row of lm_head: P(EOS) then swings between ~0 and ~1 across contexts
PROMPTS = [
    "what is 3 plus 4 ?",
    "please compute the sum of 12 and 7 and write the final answer",
    "hello world",
    "solve 8 times 9 step by step",
    "how many numbers are in this question ?",
    "the answer is",
]


def tiny_model(seed: int = 0, **config_kwargs):
    model = tiny_llama(seed=seed, vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, **config_kwargs)
    with torch.no_grad():
        model.lm_head.weight[EOS_ID] *= EOS_BOOST
    return model


def save_tiny(path: str, seed: int = 0) -> str:
    """A tiny model on disk: TRL rebuilds a full fine-tuning reference from `config._name_or_path`."""
    tiny_model(seed).save_pretrained(path)
    tiny_tokenizer(VOCAB).save_pretrained(path)
    return path


def load_tiny(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, EOS_ID
    return model


def tokenizer():
    return tiny_tokenizer(VOCAB)


def lora_config(**overrides):
    from peft import LoraConfig

    # init_lora_weights=False: B is random too, so the adapter already moves the outputs (and every LoRA matrix
    # gets a gradient on the first step), and an adapter-disabled reference differs from the policy from step 1
    kw = dict(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj", "gate_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    kw.update(overrides)
    return LoraConfig(**kw)


def peft_model(seed: int = 7):
    """The tiny model wrapped by the user in a PeftModel (its LoRA seeded): TRL then copies the adapter as a frozen
    "ref" adapter for the reference."""
    from peft import get_peft_model

    model = tiny_model(0)
    torch.manual_seed(seed)
    return get_peft_model(model, lora_config())


def head_file(trainer) -> str:
    """Source file of the log-prob head installed on the trainer's policy (TRL's utils.py or slimrl's logprob.py)."""
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.forward.__func__.__code__.co_filename


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]
