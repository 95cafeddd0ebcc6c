"""A tiny byte-level BPE tokenizer, trained in memory (milliseconds), for GGUF round trips.

slimrl.testing.tiny_tokenizer is word-level, which GGUF cannot describe (llama.cpp knows BPE, SentencePiece,
WordPiece and Unigram vocabularies, not word lists); this one is the kind SmolLM2 and Qwen2 use: byte-level BPE with
the GPT-2 pre-tokenizer, `<|endoftext|>` (pad, id 0), `<|im_start|>` (1), `<|im_end|>` (eos, 2) and a ChatML
template, so tiny_llama's pad/eos ids (0 and 2) hold.
"""

from __future__ import annotations

from slimrl.testing import CHATML_TEMPLATE

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    lines = []
    for a in range(0, 40, 3):
        for b in range(0, 30, 7):
            lines.append(
                f"<|im_start|>user\nWhat is {a} + {b}? Answer with the number.<|im_end|>\n"
                f"<|im_start|>assistant\nThe answer is {a + b}.<|im_end|>\n"
            )
            lines.append(f"Compute {a} times {b} minus {b}: the result is {a * b - b}.")
    return lines


def tiny_bpe_tokenizer(vocab_size: int = 384):
    """A fast byte-level BPE tokenizer with exactly `vocab_size` tokens (specials included)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf
