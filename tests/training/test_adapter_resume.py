"""A multi-adapter checkpoint (the trained "default" adapter at the root, TRL's frozen "ref" copy in `ref/`) resumes
with the trained adapter on every supported transformers (slimrl.training.adapter_resume).

transformers before 5.23 loads only the adapters in folders; the installed one (5.24) loads the root too, so its own
load cannot show the problem. `load_like_transformers_5_22` is that older load, step for step
(`Trainer._load_from_checkpoint`'s `adapter_subdirs` branch): the negative control shows it leaves the built weights
in place, and slimrl's load before it restores the trained ones.
"""

import json
import os

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.patches.setup import resume_checks
from slimrl.testing import tiny_llama
from slimrl.training import adapter_resume


def built_model():
    """A LoRA model as a trainer is given it, with TRL's "ref" adapter beside the "default" one."""
    model = FastLanguageModel.get_peft_model(
        tiny_llama(seed=0, hidden_size=32, num_layers=2), r=4, random_state=1, init_lora_weights=False
    )
    model.add_adapter("ref", model.peft_config["default"])  # what GRPO, RLOO, DPO and KTO do with a PeftModel
    model.set_adapter("default")
    return model


def adapter(model, name):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n}


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint of a trained model: its "default" adapter moved away from the built one."""
    trained = built_model()
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if ".default." in name:
                param.add_(0.25)
    trained.save_pretrained(str(tmp_path))
    assert os.path.isfile(tmp_path / "adapter_model.safetensors") and adapter_resume.adapter_folders(str(tmp_path))
    return str(tmp_path), adapter(trained, "default"), adapter(trained, "ref")


def load_like_transformers_5_22(model, folder):
    """transformers 5.17-5.22: with adapters in folders, only those are loaded, then the active one is set."""
    active = model.active_adapters[0]
    for name in adapter_resume.adapter_folders(folder):
        model.load_adapter(os.path.join(folder, name), name, is_trainable=name == active)
    model.set_adapter(active)


def assert_adapter(model, expected):
    for name, value in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), value, atol=0, rtol=0)


def test_old_load_alone_keeps_the_built_adapter(checkpoint):
    folder, trained, _ = checkpoint
    model = built_model()
    load_like_transformers_5_22(model, folder)
    with pytest.raises(AssertionError):  # negative control: the resumed run would train on from the built weights
        assert_adapter(model, trained)


def test_slimrl_loads_the_trained_adapter_before_the_old_load(checkpoint):
    folder, trained, ref = checkpoint
    model = built_model()
    assert adapter_resume.load_root_adapter(model, folder)
    load_like_transformers_5_22(model, folder)
    assert_adapter(model, trained)
    assert_adapter(model, ref)
    assert model.active_adapters == ["default"]
    assert all(p.requires_grad == (".default." in n) for n, p in model.named_parameters() if "lora_" in n)


def test_nothing_loaded_where_transformers_loads_it_or_nothing_is_skipped(checkpoint, tmp_path, monkeypatch):
    folder, _, _ = checkpoint
    monkeypatch.setattr(adapter_resume, "ROOT_ADAPTER_LOADED_FROM", "5.0")  # as if transformers loaded it itself
    assert not adapter_resume.restore_root_adapter(built_model(), folder)
    monkeypatch.setattr(adapter_resume, "ROOT_ADAPTER_LOADED_FROM", "99")  # as if it were an older transformers
    assert adapter_resume.restore_root_adapter(built_model(), folder)
    single = tmp_path / "single"
    FastLanguageModel.get_peft_model(tiny_llama(seed=0, hidden_size=32, num_layers=2), r=4).save_pretrained(single)
    assert not adapter_resume.load_root_adapter(built_model(), str(single))  # one adapter: transformers loads it
    assert not adapter_resume.load_root_adapter(tiny_llama(seed=0, hidden_size=32, num_layers=2), folder)


def test_patched_train_loads_it_before_the_trainers_train(checkpoint, monkeypatch):
    folder, trained, _ = checkpoint
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump({}, f)
    torch.save({}, os.path.join(folder, "optimizer.pt"))
    monkeypatch.setattr(adapter_resume, "ROOT_ADAPTER_LOADED_FROM", "99")  # as if it were an older transformers

    class Trainer:
        def __init__(self):
            self.model = built_model()

    trainer = Trainer()
    resume_checks.make_train(load_like_transformers_5_22_train)(trainer, folder)
    assert_adapter(trainer.model, trained)


def load_like_transformers_5_22_train(trainer, resume_from_checkpoint=None):
    load_like_transformers_5_22(trainer.model, resume_from_checkpoint)
