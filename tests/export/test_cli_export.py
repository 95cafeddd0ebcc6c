"""`slimrl export` on an adapter folder laid out as `slimrl grpo` writes it, and the hint training commands print."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimrl import FastLanguageModel
from slimrl.cli import main

from _export_helpers import assert_same_logits, logits


@pytest.fixture
def run_dir(peft_model, base_dir, tmp_path):
    """An output_dir as a training run leaves it: adapter, tokenizer, slimrl_run.json."""
    model, tokenizer = peft_model
    out = tmp_path / "run1"
    model.save_lora(str(out))
    tokenizer.save_pretrained(out)
    (out / "slimrl_run.json").write_text(json.dumps({"model_name_or_path": base_dir, "dtype": "float32"}))
    return str(out)


def test_export_gguf_and_merged(run_dir, peft_model, capsys):
    model, tokenizer = peft_model
    assert main(["export", "--adapter", run_dir, "--format", "gguf", "--quantization", "f16"]) == 0
    gguf_path = os.path.join(f"{run_dir}-gguf", "model.F16.gguf")
    loaded, loaded_tokenizer = FastLanguageModel.from_pretrained(gguf_path, dtype=torch.float32)
    assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), 2e-3)
    assert main(["export", "--adapter", run_dir, "--dtype", "float32"]) == 0  # --format merged is the default
    merged = AutoModelForCausalLM.from_pretrained(f"{run_dir}-merged")
    assert_same_logits(logits(model, tokenizer), logits(merged, tokenizer), 4e-6)
    printed = capsys.readouterr().out
    assert "model.F16.gguf" in printed and "ollama create" in printed and "vllm serve" in printed


def test_export_push_to_hub(run_dir, monkeypatch, tmp_path):
    from huggingface_hub import constants

    from _hub_standin import StandIn

    with StandIn() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        out = str(tmp_path / "gguf")
        assert (
            main(
                [
                    "export",
                    "--adapter",
                    run_dir,
                    "--format",
                    "gguf",
                    "--quantization",
                    "q8_0",
                    "--output_dir",
                    out,
                    "--push_to_hub",
                    "alice/run1-gguf",
                    "--token",
                    "hf_test",
                ]
            )
            == 0
        )
    assert {"model.Q8_0.gguf", "Modelfile", "README.md"} <= set(hub.repos["alice/run1-gguf"])
    assert hub.private["alice/run1-gguf"] == "private"  # without --public


def test_bad_flags_fail_before_loading(run_dir, monkeypatch, tmp_path):
    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded the model before checking the flags")

    monkeypatch.setattr("slimrl.cli.modeling.load_adapter", must_not_load)
    with pytest.raises(SystemExit, match="llama-quantize"):
        main(["export", "--adapter", run_dir, "--format", "gguf", "--quantization", "q4_k_m"])
    with pytest.raises(SystemExit, match="user/my-model"):
        main(["export", "--adapter", run_dir, "--push_to_hub", "no-namespace"])
    with pytest.raises(SystemExit, match="no adapter"):
        main(["export", "--adapter", str(tmp_path)])
    # argparse: not allowed together (a one-line user error, exit status 2)
    assert main(["export", "--adapter", run_dir, "--push_to_hub", "a/b", "--public", "--private"]) == 2


def test_training_commands_end_with_the_export_hint(tmp_path, capsys):
    from slimrl.cli.training_run import write_run_outputs

    write_run_outputs(str(tmp_path), {"model_name_or_path": "smollm2-135m"}, None, None, 1.0, 0.0, 1, plot=False)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"[slimrl] export: slimrl export --adapter {tmp_path} --format gguf")
