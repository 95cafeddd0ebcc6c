"""Tiny local assets for tests and benchmarks: a word-level tokenizer with a ChatML template and random Llama models.

Nothing here downloads anything. The tokenizer is built in memory from a fixed word list padded with filler tokens up
to the requested vocabulary size, so a benchmark can ask for V=152k and still decode every sampled id.
"""

from __future__ import annotations

import os
import tempfile

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
_WORDS = (
    "the a an is are was what how many much plus minus times answer question user assistant system "
    "solve compute write number numbers sum difference product think step final result and or not "
    "yes no good bad hello world please thanks i you we it to of in on for with as by at be this that"
).split()
_SYMBOLS = list("0123456789+-*/=()<>.,:;!?'\"[]{}#%&_|\\^~$@`") + ["\n"]
_LETTERS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def tiny_tokenizer(vocab_size: int = 512):
    """A fast word-level tokenizer (digits and symbols split one per token) with pad/eos and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = SPECIAL_TOKENS + ["assistant\n", "user\n", "system\n"] + _SYMBOLS + _LETTERS + _WORDS
    seen, vocab = set(), {}
    for tok in base:
        if tok not in seen:
            seen.add(tok)
            vocab[tok] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be at least {len(vocab)}")
    for i in range(len(vocab), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern="\n", behavior="isolated"),
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins word-level tokens with spaces
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    hf.chat_template = CHATML_TEMPLATE
    hf.padding_side = "left"
    return hf


def tiny_llama_config(
    vocab_size: int = 512,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = False,
    **kwargs,
):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        **kwargs,
    )


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs):
    """A random Llama causal LM built from a config (no download); same seed → same weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(**config_kwargs), dtype=dtype)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model


def save_tiny_model(
    path: str | os.PathLike | None = None, vocab_size: int = 512, seed: int = 0, **config_kwargs
) -> str:
    """Save a tiny random model and its tokenizer to a folder (TRL reloads full-fine-tuning references by path)."""
    path = str(path or tempfile.mkdtemp(prefix="slimrl-tiny-"))
    tiny_llama(seed=seed, vocab_size=vocab_size, **config_kwargs).save_pretrained(path)
    tiny_tokenizer(vocab_size).save_pretrained(path)
    return path
