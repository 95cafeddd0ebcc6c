"""Shared fixtures for the export tests: a tiny Llama with a byte-level BPE tokenizer, LoRA on top, greedy helpers."""

import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))

PROMPTS = ["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nCompute 12 times 5 minus 5.<|im_end|>\n<|im_start|>assistant\n"]


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
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, init_lora_weights=False,
                                             use_gradient_checkpointing=False, random_state=1)
    model.eval()
    return model, tokenizer


def encode(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


@torch.no_grad()
def logits(model, tokenizer, text: str = PROMPTS[0]) -> torch.Tensor:
    return model(encode(tokenizer, text)).logits[0].float()


@torch.no_grad()
def greedy(model, tokenizer, text: str, max_new_tokens: int = 10) -> list[int]:
    ids = encode(tokenizer, text)
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                         pad_token_id=tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None)
    return out[0, ids.shape[1]:].tolist()


def assert_same_logits(reference: torch.Tensor, candidate: torch.Tensor, atol: float) -> None:
    """The comparison every round trip uses; its negative controls show a 0.1% weight error fails it."""
    difference = (reference - candidate).abs().max().item()
    assert difference <= atol, f"logits differ by {difference:.3g} > {atol:.3g}"
