"""save_pretrained_merged: a plain transformers folder with the adapter's outputs; the training model untouched."""

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slimrl.export import merged
from slimrl.generation.weights import dense_weight

from _export_helpers import PROMPTS, assert_same_logits, greedy, logits

F32_ATOL = 4e-6


def test_float32_merge_matches_adapter_and_small_error_fails(peft_model, tmp_path):
    model, tokenizer = peft_model
    out = model.save_pretrained_merged(str(tmp_path), tokenizer, dtype=torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, no peft, no slimrl
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    for prompt in PROMPTS:
        assert_same_logits(logits(model, tokenizer, prompt), logits(loaded, loaded_tokenizer, prompt), F32_ATOL)
        assert greedy(loaded, loaded_tokenizer, prompt) == greedy(model, tokenizer, prompt)
    with torch.no_grad():  # negative control: layer 0's q_proj matrix x 1.001 fails the same comparison
        loaded.model.layers[0].self_attn.q_proj.weight.mul_(1.001)
    with pytest.raises(AssertionError, match="logits differ"):
        assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)


def test_base_saved_without_the_merge_fails(peft_model, tmp_path):
    model, tokenizer = peft_model
    merged.save_merged_16bit(model, str(tmp_path), tokenizer, torch.float32, use_adapter=False)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    with pytest.raises(AssertionError, match="logits differ"):
        assert_same_logits(logits(model, tokenizer), logits(loaded, tokenizer), F32_ATOL)


def test_training_model_untouched_and_keeps_training(peft_model, tmp_path):
    model, tokenizer = peft_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.save_pretrained_merged(str(tmp_path), tokenizer, dtype=torch.float32)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert changed and all(".lora_" in k for k in changed)


def test_sixteen_bit_default_dtype_config_and_tokenizer(peft_model, tmp_path):
    model, tokenizer = peft_model
    with pytest.warns(UserWarning, match="computes in float32; saving float16"):
        out = model.save_pretrained_merged(str(tmp_path), tokenizer)
    config = json.loads(Path(out, "config.json").read_text())
    assert config["dtype"] == "float16" and "quantization_config" not in config
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    reference = dict(merged.merged_state_dict(model, torch.float32))
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, reference[name].to(torch.float16).float()), name
    for prompt in PROMPTS:
        assert greedy(loaded, tokenizer, prompt) == greedy(model, tokenizer, prompt)
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    assert loaded_tokenizer.apply_chat_template(chat, tokenize=False) == tokenizer.apply_chat_template(
        chat, tokenize=False
    )
    bf16 = model.save_pretrained_merged(str(tmp_path / "bf16"), tokenizer, dtype=torch.bfloat16)
    assert json.loads(Path(bf16, "config.json").read_text())["dtype"] == "bfloat16"


def test_float16_overflow_raises_before_writing(peft_model, tmp_path):
    model, tokenizer = peft_model
    with torch.no_grad():
        model.get_base_model().model.norm.weight[0] = 1e6
    with pytest.raises(ValueError, match="float16's range"):
        model.save_pretrained_merged(str(tmp_path / "out"), tokenizer, dtype=torch.float16)
    assert not (tmp_path / "out").exists()


def test_sharded_above_max_shard_size(peft_model, tmp_path):
    model, tokenizer = peft_model
    out = model.save_pretrained_merged(str(tmp_path), tokenizer, dtype=torch.float32, max_shard_size="100KB")
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert len(shards) > 1 and os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert_same_logits(logits(model, tokenizer), logits(loaded, tokenizer), F32_ATOL)


@pytest.mark.parametrize("targets", [None, ["q_proj"]])  # ["q_proj"]: plain 4-bit layers are dequantized too
def test_four_bit_base_dequantized(base_dir, tmp_path, targets):
    pytest.importorskip("bitsandbytes")
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(base_dir, dtype=torch.float32, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(
        model, r=4, target_modules=targets, init_lora_weights=False, use_gradient_checkpointing=False
    )
    model.eval()
    out = model.save_pretrained_merged(str(tmp_path / "16"), tokenizer, dtype=torch.float32)
    config = json.loads(Path(out, "config.json").read_text())
    assert "quantization_config" not in config
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert_same_logits(logits(model, tokenizer), logits(loaded, tokenizer), F32_ATOL)  # bitsandbytes' own dequant


def test_merged_4bit(base_dir, tmp_path):
    pytest.importorskip("bitsandbytes")
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(base_dir, dtype=torch.float32, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, use_gradient_checkpointing=False)
    model.eval()
    out4 = model.save_pretrained_merged(str(tmp_path / "4"), tokenizer, save_method="merged_4bit_forced")
    assert json.loads(Path(out4, "config.json").read_text())["quantization_config"]["load_in_4bit"]
    reloaded = AutoModelForCausalLM.from_pretrained(out4, device_map="cpu")
    name = "model.layers.0.self_attn.q_proj.weight"
    stored = dense_weight(reloaded.model.layers[0].self_attn.q_proj.weight).float()
    with_lora = merged.merged_state_dict(model, torch.float32)[name]
    without = merged.merged_state_dict(model, torch.float32, use_adapter=False)[name]
    # NF4 of the merged weight: near it (NF4 rounding), and far nearer than the unmerged base is
    assert (stored - with_lora).abs().mean() < 0.25 * (stored - without).abs().mean()
    assert greedy(reloaded, tokenizer, PROMPTS[0], max_new_tokens=3)  # it generates


def test_lora_method_and_bad_arguments(peft_model, tmp_path):
    model, tokenizer = peft_model
    out = model.save_pretrained_merged(str(tmp_path / "lora"), tokenizer, save_method="lora")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    with pytest.raises(ValueError, match="save_method must be one of"):
        model.save_pretrained_merged(str(tmp_path / "bad"), tokenizer, save_method="merged_8bit")
    with pytest.raises(TypeError, match="no_such_option"):
        model.save_pretrained_merged(str(tmp_path / "bad"), tokenizer, no_such_option=1)
    with pytest.warns(UserWarning, match="maximum_memory_usage"):
        model.save_pretrained_merged(str(tmp_path / "ok"), tokenizer, dtype=torch.float32, maximum_memory_usage=0.5)
    assert not os.path.exists(tmp_path / "bad")


def test_dora_refused(base_dir, tmp_path):
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(base_dir, dtype=torch.float32)
    model = FastLanguageModel.get_peft_model(model, r=4, use_dora=True, use_gradient_checkpointing=False)
    with pytest.raises(NotImplementedError, match="DoRA"):
        model.save_pretrained_merged(str(tmp_path), tokenizer)
    assert not os.listdir(tmp_path)
