"""The methods on FastLanguageModel's models: Unsloth's names and arguments, reversible, deepcopy/pickle-safe;
save_lora / load_lora; an adapter names the base the user asked for and loads back by its folder."""

import copy
import inspect
import json
import os
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.export import METHOD_NAMES, ExportMethod, attach_export_methods, detach_export_methods
from slimrl.models import adapters
from slimrl.state import model_state

from _export_helpers import assert_same_logits, logits

# Unsloth's leading parameters, in order (unsloth/save.py)
UNSLOTH_PARAMETERS = {
    "save_pretrained_merged": ["save_directory", "tokenizer", "save_method", "push_to_hub", "token"],
    "push_to_hub_merged": ["repo_id", "tokenizer", "save_method"],
    "save_pretrained_gguf": ["save_directory", "tokenizer", "quantization_method"],
    "push_to_hub_gguf": ["repo_id", "tokenizer", "quantization_method"],
    "save_lora": ["save_directory"],
    "load_lora": ["save_directory", "load_tensors"],
}


def test_methods_on_loaded_and_peft_models_with_unsloth_signatures(peft_model):
    model, _ = peft_model
    base = model.get_base_model()
    for name in METHOD_NAMES:
        for owner in (model, base):
            method = owner.__dict__[name]
            assert isinstance(method, ExportMethod) and method.__self__ is owner
        parameters = list(inspect.signature(getattr(model, name)).parameters)
        assert parameters[: len(UNSLOTH_PARAMETERS[name])] == UNSLOTH_PARAMETERS[name]
    defaults = inspect.signature(model.save_pretrained_merged).parameters
    assert defaults["save_method"].default == "merged_16bit" and defaults["max_shard_size"].default == "5GB"
    assert inspect.signature(model.save_pretrained_gguf).parameters["quantization_method"].default == "fast_quantized"


def test_deepcopy_rebinds_pickle_and_detach(peft_model, tiny_plain_model):
    model, _ = peft_model
    clone = copy.deepcopy(model)
    assert clone.save_lora.__self__ is clone and clone.get_base_model().save_lora.__self__ is clone.get_base_model()
    restored = pickle.loads(pickle.dumps(tiny_plain_model))
    assert restored.save_pretrained_gguf.__self__ is restored
    detach_export_methods(tiny_plain_model)
    assert not any(hasattr(tiny_plain_model, name) for name in METHOD_NAMES)


@pytest.fixture
def tiny_plain_model():
    from slimrl.testing import tiny_llama

    return attach_export_methods(tiny_llama())


def test_a_class_that_defines_the_name_is_not_shadowed():
    class Model(torch.nn.Module):
        def save_lora(self, directory):
            return "own"

    with pytest.raises(RuntimeError, match="defines `save_lora` itself"):
        attach_export_methods(Model())


def test_adapter_names_the_requested_base_and_loads_from_its_folder(peft_model, base_dir, tmp_path):
    model, tokenizer = peft_model
    folder = model.save_lora(str(tmp_path / "adapter"))
    config = json.loads(Path(folder, "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == base_dir
    loaded, _ = FastLanguageModel.from_pretrained(folder, dtype=torch.float32)
    loaded.eval()
    assert_same_logits(logits(model, tokenizer), logits(loaded, tokenizer), 1e-6)
    assert any(p.requires_grad for n, p in loaded.named_parameters() if ".lora_" in n)
    assert isinstance(loaded.__dict__["save_pretrained_gguf"], ExportMethod)


def test_requested_names_and_missing_base(tmp_path, monkeypatch):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert adapters.requested_model_name("m.gguf") == str(gguf_file)  # absolute: resolvable from anywhere
    assert adapters.requested_model_name("smollm2-135m") == "smollm2-135m"
    assert adapters.requested_model_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/gone/model.gguf"}))
    assert adapters.is_adapter_folder(folder)
    with pytest.raises(FileNotFoundError, match="not on this machine"):
        FastLanguageModel.from_pretrained(str(folder))


def test_embedded_name_recorded_on_the_adapter(monkeypatch, base_dir, tmp_path):
    """What from_pretrained("smollm2-135m") records ends up in the adapter config (the loader is stubbed)."""
    from slimrl.models import loading

    real = loading.load_model_and_tokenizer

    def as_if_embedded(model_name, **kwargs):
        model, tokenizer, options = real(base_dir, **kwargs)
        model_state(model).model_name = adapters.requested_model_name(model_name)
        return model, tokenizer, options

    monkeypatch.setattr("slimrl.fast_language_model.load_model_and_tokenizer", as_if_embedded)
    model, _ = FastLanguageModel.from_pretrained("smollm2-135m", dtype=torch.float32)
    peft = FastLanguageModel.get_peft_model(model, r=2, use_gradient_checkpointing=False)
    assert peft.peft_config["default"].base_model_name_or_path == "smollm2-135m"
    assert model.config._name_or_path == base_dir  # TRL reloads references from here: unchanged
    # the model card (what push_to_hub publishes) names the embedded model's Hub id, not the local folder
    peft.save_pretrained(str(tmp_path / "adapter"))
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and base_dir not in card
    type(peft).create_or_update_model_card(peft, str(tmp_path / "stock"))  # control: peft's own card names the folder
    assert f"base_model: {base_dir}" in (tmp_path / "stock" / "README.md").read_text()


def test_card_base_model_is_a_hub_id_or_left_out(tmp_path):
    card = tmp_path / "README.md"
    for name, expected in [("org/model", "base_model: org/model"), (str(tmp_path), None), (None, None)]:
        card.write_text(
            f"---\nlibrary_name: peft\nbase_model: {tmp_path}\ntags:\n- base_model:adapter:{tmp_path}\n- lora\n---\n"
            "\nAn adapter.\n"
        )
        adapters.card_base_model(str(card), name)
        text = card.read_text()
        assert str(tmp_path) not in text and "An adapter." in text and "library_name: peft" in text
        assert (expected in text) if expected else "base_model" not in text
        assert "- lora" in text and (f"base_model:adapter:{name}" in text) == (expected is not None)


class _FakeLoRARequest:
    def __init__(self, name, lora_id, path):
        self.lora_name, self.lora_int_id, self.lora_path = name, lora_id, path


def test_load_lora(peft_model, tmp_path, monkeypatch):
    model, _ = peft_model
    with pytest.raises(ValueError, match="no vLLM engine"):
        model.load_lora(str(tmp_path))
    vllm = types.ModuleType("vllm")
    vllm.lora = types.ModuleType("vllm.lora")
    vllm.lora.request = types.SimpleNamespace(LoRARequest=_FakeLoRARequest)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", vllm.lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", vllm.lora.request)
    model.get_base_model().vllm_engine = types.SimpleNamespace(weight_sync="merged")  # the CPU default takes it too
    try:
        with pytest.raises(FileNotFoundError, match="adapter_config.json"):
            model.load_lora(str(tmp_path / "none"))
        first = model.load_lora(str(tmp_path / "live"), load_tensors=True)
        model.get_base_model().vllm_engine.weight_sync = "lora"
        second = model.load_lora(str(tmp_path / "live"))
        assert os.path.isfile(tmp_path / "live" / "adapter_config.json")
        assert first.lora_path == str(tmp_path / "live") and second.lora_int_id == first.lora_int_id + 1
    finally:
        del model.get_base_model().vllm_engine
