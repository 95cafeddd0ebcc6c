"""Shared fixtures for the export tests: a tiny Llama with a byte-level BPE tokenizer, LoRA on top."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # _export_helpers, _tiny_bpe, _hub_standin


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from _tiny_bpe import tiny_bpe_tokenizer

    return tiny_bpe_tokenizer()


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory, bpe_tokenizer):
    """A tiny Llama (untied head) + the BPE tokenizer saved as a folder."""
    from slimrl.testing import tiny_llama

    path = tmp_path_factory.mktemp("base")
    tiny_llama(vocab_size=len(bpe_tokenizer), hidden_size=64, num_layers=2).save_pretrained(path)
    bpe_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def peft_model(base_dir):
    """(PeftModel, tokenizer): the base above in float32 with a random (non-zero) LoRA on every projection."""
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(base_dir, dtype=torch.float32, max_seq_length=128)
    model = FastLanguageModel.get_peft_model(
        model, r=4, lora_alpha=8, init_lora_weights=False, use_gradient_checkpointing=False, random_state=1
    )
    model.eval()
    return model, tokenizer
