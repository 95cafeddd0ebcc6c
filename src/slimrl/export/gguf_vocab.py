"""The tokenizer as GGUF metadata (llama.cpp's keys), so llama.cpp, Ollama and LM Studio load the file as is.

Choices:
- Byte-level BPE only (`tokenizer.ggml.model = "gpt2"`: SmolLM2, Llama 3, Qwen2, GPT-2): the tokens are the
  vocabulary in its byte-level spelling, padded with `[PAD<i>]` (type UNUSED) up to the model's embedding rows;
  added tokens are CONTROL when special, USER_DEFINED otherwise, as llama.cpp's own converter marks them. Other
  tokenizer models (SentencePiece, WordPiece, word-level) raise, naming the model found.
- Merges, special token ids, add-BOS/EOS flags and the chat template come from `gguf.vocab.SpecialVocab` (the
  part llama.cpp's converter uses) reading the tokenizer saved to a temporary folder; whether BOS/EOS are added is
  then checked against what the tokenizer actually does on a sample text.
- `tokenizer.ggml.pre` (how llama.cpp splits text before BPE) is read off the tokenizer's pre-tokenizer: a plain
  byte-level split is "gpt-2", digits-then-byte-level is "smollm", and a regex split is named by reversing
  transformers' own GGUF table (the names transformers' GGUF reader maps back to the same regex). Anything else
  raises and names `gguf_pre_tokenizer=` to state it: a wrong guess would tokenize differently from training.
"""

from __future__ import annotations

import json
import tempfile

_BYTE_LEVEL_ONLY = "gpt-2"
_DIGITS_THEN_BYTE_LEVEL = "smollm"


def _transformers_pre_tokenizer_names() -> dict[str, str]:
    """{split regex: first llama.cpp name} from transformers' GGUF reader table (empty if it moved)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return {}
    names: dict[str, str] = {}
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        names.setdefault(regex, name)
    return names


def _describe(pre: dict | None) -> str:
    return json.dumps(pre)[:300] if pre is not None else "None"


def pre_tokenizer_name(backend_json: dict) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a byte-level BPE tokenizer (tokenizer.json as a dict); raises if unknown."""
    pre = backend_json.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return _BYTE_LEVEL_ONLY
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return _DIGITS_THEN_BYTE_LEVEL
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        regex = steps[0].get("pattern", {}).get("Regex")
        name = _transformers_pre_tokenizer_names().get(regex)
        if name is not None:
            return name
    raise ValueError(
        f"GGUF export: cannot name this tokenizer's pre-tokenizer for llama.cpp ({_describe(pre)}). "
        "Pass gguf_pre_tokenizer='<name>' (llama.cpp's `tokenizer.ggml.pre`, e.g. 'llama-bpe', 'qwen2', "
        "'gpt-2') to state it."
    )


def _token_list(tokenizer, backend_json: dict, n_vocab: int) -> tuple[list[str], list[int]]:
    """(tokens, llama.cpp token types) for ids 0..n_vocab-1."""
    import gguf

    by_id = {index: token for token, index in backend_json["model"]["vocab"].items()}
    added = {index: token for index, token in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for index in range(n_vocab):
        if index in added:
            tokens.append(added[index].content)
            types.append(gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED)
        elif index in by_id:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
    return tokens, types


def _adds(tokenizer, token_id: int | None, position: int) -> bool:
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[position] == token_id


def add_tokenizer(writer, tokenizer, n_vocab: int, pre_tokenizer: str | None = None) -> str:
    """Write the tokenizer's GGUF metadata into `writer`; returns the `tokenizer.ggml.pre` written."""
    from gguf.vocab import SpecialVocab

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"GGUF export needs a fast (tokenizers-backed) tokenizer; got {type(tokenizer).__name__}.")
    backend_json = json.loads(backend.to_str())
    model_type = backend_json["model"].get("type")
    if model_type != "BPE" or not any(d.get("type") == "ByteLevel" for d in _decoders(backend_json)):
        raise NotImplementedError(
            f"GGUF export supports byte-level BPE tokenizers (SmolLM2, Llama 3, Qwen2); this one "
            f"is {model_type} with decoder {_describe(backend_json.get('decoder'))}."
        )
    if len(tokenizer) > n_vocab:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the model only {n_vocab} embedding rows.")
    pre = pre_tokenizer or pre_tokenizer_name(backend_json)
    tokens, types = _token_list(tokenizer, backend_json, n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    with tempfile.TemporaryDirectory(prefix="slimrl-gguf-tok-") as folder:
        tokenizer.save_pretrained(folder)
        special = SpecialVocab(folder, load_merges=True, n_vocab=n_vocab)
    special.add_special_token["bos"] = _adds(tokenizer, tokenizer.bos_token_id, 0)
    special.add_special_token["eos"] = _adds(tokenizer, tokenizer.eos_token_id, -1)
    if special.chat_template is None and getattr(tokenizer, "chat_template", None):
        special.chat_template = tokenizer.chat_template
    special.add_to_gguf(writer, quiet=True)
    return pre


def _decoders(backend_json: dict) -> list[dict]:
    decoder = backend_json.get("decoder") or {}
    return decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
