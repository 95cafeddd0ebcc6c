"""What the vLLM engine receives (no vLLM needed): merged weights equal peft's merge, the model is left untouched,
and the state key changes exactly when the weights generation should use change."""

import gc
import os
import shutil
import subprocess
import sys

import pytest
import torch

from slimrl.generation import weights
from slimrl.generation.engine_setup import cpu_kv_cache_bytes, resolve_weight_sync
from slimrl.testing import tiny_llama


def _lora(seed=0, **config):
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(seed=seed, **config)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return peft_model


def _state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_merged_weights_equal_peft_merge_and_leave_the_model_untouched():
    model = _lora()
    before = _state(model)
    pushed = dict(weights.engine_weights(model, torch.float32))
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), "the training weights changed"
    merged = _lora().merge_and_unload().state_dict()
    assert set(pushed) == set(merged)
    for name, tensor in pushed.items():
        torch.testing.assert_close(tensor, merged[name], rtol=1e-6, atol=1e-6, msg=name)
    base = dict(weights.engine_weights(model, torch.bfloat16, use_adapter=False))
    plain = tiny_llama(seed=0).state_dict()
    assert all(base[n].dtype == torch.bfloat16 and torch.equal(base[n], plain[n].bfloat16()) for n in base)
    assert any(not torch.equal(base[n].float(), pushed[n].bfloat16().float()) for n in base)  # the control differs


def test_full_model_pushes_every_weight_under_its_own_name():
    model = tiny_llama(seed=1)
    pushed = dict(weights.engine_weights(model, torch.float32))
    assert pushed.keys() == dict(model.named_parameters()).keys()


def test_state_key_tracks_training_adapter_switch_and_disable():
    model = _lora()
    key = weights.state_key(model, use_adapter=True)
    assert weights.state_key(model, use_adapter=True) == key  # nothing changed: no re-sync
    assert weights.state_key(model, use_adapter=False) == ("base",)
    with model.disable_adapter():
        assert weights.adapters_disabled(model)
    assert not weights.adapters_disabled(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    out = model(input_ids=torch.tensor([[1, 5, 7, 9]]), labels=torch.tensor([[1, 5, 7, 9]]))
    out.loss.backward()
    opt.step()
    assert weights.state_key(model, use_adapter=True) != key
    # the transformers model inside the PeftModel (where fast_generate lives) sees the same layers and state
    inner = model.get_base_model()
    assert weights.lora_layers(inner).keys() == {
        k.removeprefix("base_model.model.") for k in weights.lora_layers(model)
    }
    assert weights.state_key(inner, use_adapter=True) == weights.state_key(model, use_adapter=True)


def test_dora_is_refused_rather_than_merged_wrongly():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(NotImplementedError, match="use_dora"):
        weights.check_mergeable(model)


def test_weight_sync_auto_per_device_and_cpu_kv_budget():
    assert resolve_weight_sync("auto", "cpu") == "merged" and resolve_weight_sync("auto", "cuda") == "lora"
    assert resolve_weight_sync("lora", "cpu") == "lora"
    with pytest.raises(ValueError, match="vllm_weight_sync"):
        resolve_weight_sync("both", "cpu")
    model = tiny_llama(vocab_size=512, hidden_size=32)  # ~50k params
    params = sum(p.numel() for p in model.parameters())
    assert cpu_kv_cache_bytes(model, torch.bfloat16, 0.5, total_ram=2**30) == 2**29 - 2 * params
    with pytest.raises(ValueError, match="gpu_memory_utilization=1e-06"):
        cpu_kv_cache_bytes(model, torch.float32, 1e-6, total_ram=2**30)


def test_a_multiprocess_vllm_setting_raises_instead_of_being_overridden(monkeypatch):
    from slimrl.generation import vllm_engine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING is set to '1'"):
        vllm_engine._in_process()
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    vllm_engine._in_process()
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_adapter_folders_in_shared_memory_are_removed_even_without_close():
    """The vLLM LoRA hand-over's folder (RAM in /dev/shm) goes at close, at garbage collection, or at exit."""
    from slimrl.generation.weights import AdapterFolders

    folders = AdapterFolders()
    root = folders.root
    os.makedirs(os.path.join(root, "update-1"))
    folders.cleanup()
    assert not os.path.exists(root)
    folders.cleanup()  # idempotent

    folders = AdapterFolders()
    root = folders.root
    del folders
    gc.collect()
    assert not os.path.exists(root), "dropped without close(): the finalizer removes it"

    code = (
        "import os, sys\n"
        "from slimrl.generation.weights import AdapterFolders\n"
        "keep = AdapterFolders()\n"  # alive until the interpreter exits, never closed
        "os.makedirs(os.path.join(keep.root, 'update-1'))\n"
        "print(keep.root)\n"
        "sys.stdout.flush()\n"
        "os._exit(0) if len(sys.argv) > 1 else None\n"
    )
    exited = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert not os.path.exists(exited.stdout.strip()), "removed when the interpreter exits"
    killed = subprocess.run([sys.executable, "-c", code, "hard"], capture_output=True, text=True, timeout=120)
    leaked = killed.stdout.strip()
    assert os.path.exists(leaked), "negative control: a process that skips exit handlers leaves the folder"
    shutil.rmtree(leaked)
