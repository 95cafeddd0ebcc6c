"""GGUF export: the file loads back through slimrl's GGUF loader with the adapter's outputs; bad input raises."""

import json

import gguf
import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.export import gguf_writer

from _export_helpers import PROMPTS, assert_same_logits, encode, greedy, logits

F32_ATOL = 4e-6  # float32 file: merge + llama.cpp layout + reader's inverse; a 0.1% error on one weight gives > 1e-5


def _load(path):
    return FastLanguageModel.from_pretrained(str(path), dtype=torch.float32)


def test_f32_round_trip_is_exact_and_a_small_error_fails(peft_model, tmp_path):
    model, tokenizer = peft_model
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="f32")
    loaded, loaded_tokenizer = _load(path)
    for prompt in PROMPTS:
        assert_same_logits(logits(model, tokenizer, prompt), logits(loaded, loaded_tokenizer, prompt), F32_ATOL)
    # negative control: layer 0's q_proj matrix (permuted, LoRA-merged) x 1.001 must fail the same comparison
    with torch.no_grad():
        loaded.model.layers[0].self_attn.q_proj.weight.mul_(1.001)
    with pytest.raises(AssertionError, match="logits differ"):
        assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)


@pytest.mark.parametrize("method, atol", [("not_quantized", 2e-3), ("bf16", 2e-2), ("fast_quantized", 5e-2)])
def test_f16_bf16_q8_greedy_match(peft_model, tmp_path, method, atol):
    model, tokenizer = peft_model
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method=method)
    quantization = gguf_writer.resolve_quantization(method)
    assert path.endswith(f"model.{quantization.upper()}.gguf")
    loaded, loaded_tokenizer = _load(path)
    assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), atol)
    compared = 10 if quantization in ("f16", "bf16") else 3  # q8_0: the first tokens
    for prompt in PROMPTS:
        assert greedy(loaded, loaded_tokenizer, prompt)[:compared] == greedy(model, tokenizer, prompt)[:compared]


def test_base_exported_without_the_merge_fails(peft_model, tmp_path):
    """Negative control: the same writer with the adapter left out gives the base model, not the adapter's outputs."""
    model, tokenizer = peft_model
    path = str(tmp_path / "base.gguf")
    gguf_writer.write_gguf(model, tokenizer, path, "f32", use_adapter=False)
    loaded, loaded_tokenizer = _load(path)
    with pytest.raises(AssertionError, match="logits differ"):
        assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)
    with model.disable_adapter():
        assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)


def test_training_model_untouched_and_metadata(peft_model, tmp_path):
    model, tokenizer = peft_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="q8_0")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.t")}
    assert fields["general.architecture"] == "llama" and fields["llama.block_count"] == 2
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    assert fields["tokenizer.ggml.eos_token_id"] == 2 and fields["tokenizer.ggml.padding_token_id"] == 0
    assert fields["tokenizer.chat_template"] == tokenizer.chat_template
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"
    assert "output.weight" in types  # untied head written; tied models omit it (next test)
    assert (tmp_path / "Modelfile").read_text().startswith("FROM ./model.Q8_0.gguf")


def test_tied_embeddings_and_tokenizer_round_trip(bpe_tokenizer, tmp_path):
    from slimrl.testing import tiny_llama

    model = tiny_llama(vocab_size=len(bpe_tokenizer), hidden_size=64, num_layers=2, tie_word_embeddings=True)
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, use_gradient_checkpointing=False)
    model.eval()
    path = model.save_pretrained_gguf(tmp_path, bpe_tokenizer, quantization_method="f32")
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(path).tensors}
    loaded, loaded_tokenizer = _load(path)
    assert loaded.config.tie_word_embeddings
    assert_same_logits(logits(model, bpe_tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)
    for text in [*PROMPTS, "plain text, digits 12345 and symbols #!?"]:
        assert encode(loaded_tokenizer, text).tolist() == encode(bpe_tokenizer, text).tolist()
    assert loaded_tokenizer.chat_template == bpe_tokenizer.chat_template
    assert loaded_tokenizer.eos_token == "<|im_end|>"


def test_qwen2_round_trip(bpe_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2Tokenizer

    backend = json.loads(bpe_tokenizer.backend_tokenizer.to_str())
    tokenizer = Qwen2Tokenizer(
        vocab=backend["model"]["vocab"],
        merges=[tuple(m) for m in backend["model"]["merges"]],
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = bpe_tokenizer.chat_template
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = FastLanguageModel.get_peft_model(
        AutoModelForCausalLM.from_config(config), r=4, init_lora_weights=False, use_gradient_checkpointing=False
    )
    model.eval()
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="f32")
    fields = gguf.GGUFReader(path).fields
    assert fields["general.architecture"].contents() == "qwen2"
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2"
    loaded, loaded_tokenizer = _load(path)
    assert_same_logits(logits(model, tokenizer), logits(loaded, loaded_tokenizer), F32_ATOL)


@pytest.mark.parametrize("method", ["q4_0", "q5_1"])
def test_low_bit_types_load_back(peft_model, tmp_path, method):
    model, tokenizer = peft_model
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method=method)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up.weight"] == method.upper() and types["output.weight"] == "Q8_0"
    loaded, loaded_tokenizer = _load(path)
    reference = logits(model, tokenizer)
    assert_same_logits(reference, logits(loaded, loaded_tokenizer), 0.5 * reference.abs().max().item())


def test_unsupported_requests_raise_before_writing(peft_model, tmp_path):
    model, tokenizer = peft_model
    with pytest.raises(NotImplementedError, match="llama-quantize"):
        model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="q4_k_m")
    with pytest.raises(NotImplementedError, match="llama-quantize"):
        model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="quantized")
    with pytest.raises(ValueError, match="Unknown quantization_method"):
        model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="q9_9")
    with pytest.raises(ValueError, match="push_to_hub_gguf"):
        model.save_pretrained_gguf(tmp_path, tokenizer, push_to_hub=True)
    with pytest.raises(NotImplementedError, match="convert_lora_to_gguf"):
        model.save_pretrained_gguf(tmp_path, tokenizer, save_method="lora")
    assert not list(tmp_path.iterdir())


def test_unsupported_architecture_tokenizer_and_rope_raise(tmp_path):
    from transformers import AutoModelForCausalLM, GPT2Config

    from slimrl.testing import tiny_llama, tiny_tokenizer

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=512))
    with pytest.raises(NotImplementedError, match="'gpt2'"):
        gguf_writer.write_gguf(gpt2, tiny_tokenizer(), str(tmp_path / "a.gguf"), "f16")
    with pytest.raises(NotImplementedError, match="WordLevel"):
        gguf_writer.write_gguf(tiny_llama(), tiny_tokenizer(), str(tmp_path / "b.gguf"), "f16")
    scaled = tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(NotImplementedError, match="rope_type='linear'"):
        gguf_writer.write_gguf(scaled, tiny_tokenizer(), str(tmp_path / "c.gguf"), "f16")


def test_unknown_pre_tokenizer_raises_and_can_be_stated(bpe_tokenizer, peft_model, tmp_path):
    from tokenizers import pre_tokenizers

    model, _ = peft_model
    tokenizer = bpe_tokenizer.__class__(
        tokenizer_object=bpe_tokenizer.backend_tokenizer.__class__.from_str(bpe_tokenizer.backend_tokenizer.to_str()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel(use_regex=False)]
    )
    with pytest.raises(ValueError, match="gguf_pre_tokenizer"):
        model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="f16")
    path = model.save_pretrained_gguf(tmp_path, tokenizer, quantization_method="f16", gguf_pre_tokenizer="default")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == "default"
