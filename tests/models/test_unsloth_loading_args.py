"""from_pretrained keywords of Unsloth's notebooks that transformers 5 or slimrl spell differently or lack: each is
mapped with a notice, ignored with a warning (an Unsloth-only memory option), or refused with a clear error."""

import logging

import pytest
import torch

from slimrl import FastLanguageModel


def _notices(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "slimrl"]


def test_torch_dtype_is_dtype(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, torch_dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16  # transformers 4.x's name honoured, not dropped for slimrl's own choice
    assert any("torch_dtype=...) is transformers 5's dtype" in m for m in _notices(caplog))
    model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="bfloat16", torch_dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"both dtype=float32 and torch_dtype=torch.bfloat16"):
        FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", torch_dtype=torch.bfloat16)


@pytest.mark.parametrize("keyword, value", [("offload_embedding", True), ("device_map_planner_kwargs", {"rows": 4})])
def test_unsloth_memory_options_are_warned_about_and_ignored(tiny_model_dir, keyword, value):
    with pytest.warns(UserWarning, match=rf"`{keyword}` is an Unsloth option with no effect in slimrl"):
        model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", **{keyword: value})
    assert not hasattr(model.config, keyword)


def test_device_map_unsloth_is_slimrls_placement(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", device_map="unsloth")
    assert model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert any("device_map='unsloth'" in m for m in _notices(caplog))


def test_load_in_fp8(tiny_model_dir):
    model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", load_in_fp8=False)
    assert model.dtype == torch.float32
    with pytest.raises(NotImplementedError, match=r"load_in_fp8=True \(FP8 weights\) is not supported"):
        FastLanguageModel.from_pretrained(tiny_model_dir, load_in_fp8=True)
