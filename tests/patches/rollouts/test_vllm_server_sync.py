"""The server-mode adapter hand-over (slimrl.patches.rollouts.vllm_server) without a server: choice of path, the files
it
writes (loadable by PEFT, equal to the trained adapter), the requests it makes, in order. The real server runs in the
vLLM tier (tests/generation/test_vllm_server.py: `trl vllm-serve` on CPU, rollouts checked against the adapter)."""

import logging
import os
import types

import pytest
import torch

from slimrl import notices
from slimrl.patches.rollouts import vllm_server
from slimrl.patches.rollouts.vllm_rollouts import make_vllm_generation
from slimrl.state import config_state

import _tiny as T


class _Accelerator:
    def __init__(self, device="cpu"):
        self.device, self.is_main_process = torch.device(device), True

    def unwrap_model(self, model):
        return model


class _Dist:
    def gather_params(self, params):
        import contextlib

        return contextlib.nullcontext()


class _Client:
    """Records the LoRA endpoint calls TRL's VLLMClient session would make."""

    def __init__(self):
        self.base_url, self.model, self.calls, self.resets = "http://server", "base", [], 0
        self.session = types.SimpleNamespace(post=self._post)

    def _post(self, url, json):
        self.calls.append((url.rsplit("/", 1)[-1], json["lora_name"], json.get("lora_path")))
        return types.SimpleNamespace(status_code=200, text="ok")

    def reset_prefix_cache(self):
        self.resets += 1


def _peft_model():
    from peft import get_peft_model

    torch.manual_seed(0)
    return get_peft_model(T.tiny_model(0), T.lora_config())


def _args(**fields):
    args = types.SimpleNamespace(**{"vllm_server_sync": "auto", "vllm_mode": "server", "output_dir": "out", **fields})
    config_state(args).user_fields = frozenset(fields)
    return args


def test_choice_of_path(caplog, monkeypatch):
    monkeypatch.setattr(notices, "_said", set())  # each notice prints once per process; each test sees its own
    peft, plain = _peft_model(), T.tiny_model(0)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        assert vllm_server.uses_adapter_sync(_args(), peft, _Accelerator("cpu"))
    assert "vllm_server_sync='lora' (was 'auto')" in caplog.text
    assert not vllm_server.uses_adapter_sync(_args(), peft, _Accelerator("cuda"))  # TRL's NCCL path
    assert not vllm_server.uses_adapter_sync(_args(), plain, _Accelerator("cpu"))  # no adapter: TRL's (it raises)
    assert not vllm_server.uses_adapter_sync(_args(vllm_server_sync="merged"), peft, _Accelerator("cpu"))
    assert vllm_server.uses_adapter_sync(_args(vllm_server_sync="lora"), peft, _Accelerator("cuda"))
    with pytest.raises(ValueError, match="the model has none"):
        vllm_server.uses_adapter_sync(_args(vllm_server_sync="lora"), plain, _Accelerator("cpu"))
    with pytest.raises(ValueError, match="choose one of 'auto', 'lora', 'merged'"):
        vllm_server.check_server_sync(_args(vllm_server_sync="nccl"))


def test_former_spellings_are_accepted_with_a_notice(caplog, monkeypatch):
    monkeypatch.setattr(notices, "_said", set())
    peft = _peft_model()
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        assert vllm_server.uses_adapter_sync(_args(vllm_server_sync="adapter"), peft, _Accelerator("cuda"))
        assert not vllm_server.uses_adapter_sync(_args(vllm_server_sync="weights"), peft, _Accelerator("cpu"))
    assert "vllm_server_sync='adapter' is now spelled 'lora'" in caplog.text
    assert "vllm_server_sync='weights' is now spelled 'merged'" in caplog.text
    from slimrl.generation.vllm_engine import resolve_weight_sync

    assert resolve_weight_sync("adapter", "cpu") == "lora"  # one value set for both knobs


def test_factory_builds_the_server_class_in_server_mode(monkeypatch):
    class _Stock:
        def __init__(self, model=None, accelerator=None, **kwargs):
            self.model, self.accelerator = model, accelerator

    factory = make_vllm_generation(_Stock)
    monkeypatch.setattr(factory.server_class, "_init_vllm", lambda self: None)
    peft = _peft_model()
    built = factory(model=peft, accelerator=_Accelerator("cpu"), mode="server")
    assert isinstance(built, factory.server_class) and built.adapter_root.endswith("vllm-server-adapters")
    assert type(factory(model=peft, accelerator=_Accelerator("cuda"), mode="server")) is _Stock


def test_sync_writes_the_adapter_loads_it_and_retires_the_previous(tmp_path):
    from peft import PeftModel

    server_class = vllm_server.make_server_adapter_class(object)
    generation = server_class.__new__(server_class)
    model = _peft_model()
    generation.adapter_root, generation.served, generation.sync_count = str(tmp_path), None, 0
    generation.run_id = "r"
    generation.model, generation.accelerator, generation._dist = model, _Accelerator(), _Dist()
    generation.vllm_client = client = _Client()
    generation.sync_weights()
    first = tmp_path / "slimrl-r-step-1"
    assert client.calls == [("load_lora_adapter", "slimrl-r-step-1", str(first))] and client.model == "slimrl-r-step-1"
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    generation.sync_weights()
    assert client.calls[1:] == [
        ("load_lora_adapter", "slimrl-r-step-2", str(tmp_path / "slimrl-r-step-2")),
        ("unload_lora_adapter", "slimrl-r-step-1", None),
    ]
    assert client.model == "slimrl-r-step-2" and client.resets == 2 and not first.exists()
    loaded = PeftModel.from_pretrained(T.tiny_model(0), str(tmp_path / "slimrl-r-step-2"))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, param in loaded.named_parameters():
        if "lora_" in name:
            assert torch.equal(param, trained[name]), name  # what the server reads is what was trained
    assert os.listdir(tmp_path) == ["slimrl-r-step-2"]


def test_server_without_lora_endpoints_is_named():
    client = _Client()
    client.session = types.SimpleNamespace(post=lambda url, json: types.SimpleNamespace(status_code=404, text=""))
    with pytest.raises(RuntimeError, match="--enable-lora --max-lora-rank"):
        vllm_server.post_lora(client, "load_lora_adapter", "x", "/p")
