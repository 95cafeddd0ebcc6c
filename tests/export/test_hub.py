"""push_to_hub_merged / push_to_hub_gguf through huggingface_hub's real client, against a local Hub stand-in."""

import json

import pytest
import torch

from _hub_standin import StandIn


@pytest.fixture
def hub(monkeypatch):
    from huggingface_hub import constants

    with StandIn() as standin:
        monkeypatch.setattr(constants, "ENDPOINT", standin.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the test tier runs offline; this is a local server
        yield standin


def test_push_merged(peft_model, hub):
    model, tokenizer = peft_model
    url = model.push_to_hub_merged(
        "alice/tiny-merged", tokenizer, save_method="merged_16bit", token="hf_test", private=True, dtype=torch.float32
    )
    files = hub.repos["alice/tiny-merged"]
    assert url.startswith(f"{hub.url}/alice/tiny-merged/commit/")
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"} <= set(files)
    assert json.loads(files["config.json"])["dtype"] == "float32"
    assert hub.private["alice/tiny-merged"] == "private"
    card = files["README.md"].decode()
    assert "library_name: transformers" in card and "base_model:" not in card  # a local base is not a Hub id
    assert ("POST", "/api/repos/create") in hub.requests


def test_push_gguf_and_save_with_push_to_hub(peft_model, hub):
    model, tokenizer = peft_model
    model.push_to_hub_gguf("alice/tiny-gguf", tokenizer, quantization_method="q8_0", token="hf_test")
    assert {"model.Q8_0.gguf", "Modelfile", "README.md"} <= set(hub.repos["alice/tiny-gguf"])
    assert hub.repos["alice/tiny-gguf"]["model.Q8_0.gguf"][:4] == b"GGUF"
    model.save_pretrained_merged("alice/tiny-lora", tokenizer, save_method="lora", push_to_hub=True, token="hf_test")
    assert "adapter_model.safetensors" in hub.repos["alice/tiny-lora"]
    # private unless told: Unsloth's private=None (the Hub's default, public) means private here
    assert hub.private["alice/tiny-gguf"] == hub.private["alice/tiny-lora"] == "private"


def test_private_false_publishes(hub, tmp_path):
    from slimrl.export.hub import upload_folder

    (tmp_path / "weights.txt").write_text("x")
    upload_folder(str(tmp_path), "alice/open", token="hf_test", private=False)
    upload_folder(str(tmp_path), "alice/closed", token="hf_test")
    assert (hub.private["alice/open"], hub.private["alice/closed"]) == ("public", "private")


def test_model_card_names_hub_bases_only():
    from slimrl.export.hub import hub_base_model

    assert hub_base_model("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_base_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert hub_base_model("/models/x.gguf") is None and hub_base_model("./a/b") is None


def test_bad_repo_id_raises_before_saving(peft_model, hub):
    model, tokenizer = peft_model
    with pytest.raises(ValueError, match="save_method"):
        model.push_to_hub_merged("alice/x", tokenizer, save_method="merged_2bit")
    assert not hub.requests


def test_stand_in_rejects_a_local_base_model_like_the_hub(hub, tmp_path):
    """Negative control for the card check above: a local path as base_model is refused."""
    from slimrl.export.hub import upload_folder

    (tmp_path / "README.md").write_text("---\nbase_model: /root/.cache/slimrl/models/x\n---\n")
    with pytest.raises(ValueError, match="not a valid model id"):  # huggingface_hub's "Invalid metadata" error
        upload_folder(str(tmp_path), "alice/bad-card", token="hf_test")
