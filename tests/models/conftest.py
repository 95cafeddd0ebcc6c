"""Shared fixtures for the models tests: tiny saved models, fp32."""

import pytest

from slimrl.state import model_state


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from slimrl.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2)


@pytest.fixture
def tiny_peft():
    """A tiny fp32 Llama with random (non-zero) LoRA adapters, so every adapter weight gets a gradient."""
    from slimrl import FastLanguageModel
    from slimrl.testing import tiny_llama, tiny_tokenizer

    def make(mode=True, seed=0, **kwargs):
        model = tiny_llama(seed=seed, hidden_size=32, num_layers=2)
        model_state(model).tokenizer = tiny_tokenizer()
        model.max_seq_length = 128
        kwargs.setdefault("init_lora_weights", False)
        return FastLanguageModel.get_peft_model(
            model, r=4, lora_alpha=8, use_gradient_checkpointing=mode, random_state=1, **kwargs
        )

    return make
