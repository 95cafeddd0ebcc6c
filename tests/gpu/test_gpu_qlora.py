"""QLoRA on CUDA: NF4 weights on the GPU, LoRA gradients that survive a generate (the alternation GRPO runs), in
every checkpointing mode, and a patched GRPO run on a 4-bit model that trains every adapter weight."""

import importlib.util

import pytest
import torch

from slimrl import FastLanguageModel

from _gpu_helpers import MARKS, cuda_config, grpo_trainer, logged, patched_state, rel_err, trainable
from _models_helpers import batch, lora_grads_around_generate

pytestmark = [
    *MARKS,
    pytest.mark.skipif(
        importlib.util.find_spec("bitsandbytes") is None,
        reason="bitsandbytes not installed (scripts/gpu_wheels.sh carries it)",
    ),
]

# Repeating the same computation must give the same gradients; the trap this guards against drops them (error ~1).
# bf16: non-deterministic attention reductions may flip single bf16 roundings (unit roundoff 3.9e-3).
GRAD_RTOL = {"float32": 1e-6, "bfloat16": 1e-3}


def _qlora(model_dir: str, dtype: str, mode):
    model, _ = FastLanguageModel.from_pretrained(model_dir, dtype=dtype, load_in_4bit=True, max_seq_length=64)
    return FastLanguageModel.get_peft_model(
        model, r=4, use_gradient_checkpointing=mode, init_lora_weights=False, random_state=0
    )


@pytest.mark.parametrize("dtype, mode", [("float32", False), ("bfloat16", True), ("bfloat16", "offload")])
def test_qlora_gradients_survive_generate_on_cuda(tiny_model_dir, dtype, mode):
    import bitsandbytes as bnb

    model = _qlora(tiny_model_dir, dtype, mode)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 2 * 7 and all(m.weight.device.type == "cuda" for m in layers)
    inputs = {k: v.cuda() for k, v in batch().items()}
    before, after = lora_grads_around_generate(model, inputs)
    assert before and all(torch.isfinite(g).all() and torch.any(g != 0) for g in before.values())
    for name, grad in before.items():
        assert rel_err(after[name], grad) <= GRAD_RTOL[dtype], name


def test_patched_grpo_trains_every_adapter_of_a_4bit_model(tiny_model_dir, tmp_path, unpatched):
    with patched_state("grpo"):
        model = _qlora(tiny_model_dir, "bfloat16", True)
        start = {n: p.detach().clone() for n, p in trainable(model).items()}
        trainer = grpo_trainer(
            str(tmp_path), model, peft=False, max_steps=2, gradient_checkpointing=True, **cuda_config("bf16")
        )
        trainer.train()
    losses = logged(trainer, "loss")
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    unchanged = [n for n, p in trainable(trainer.model).items() if torch.equal(p.detach(), start[n])]
    assert start and not unchanged, unchanged


def test_generate_on_cuda_keeps_bitsandbytes_forwards(tiny_model_dir):
    """models/dequantized_generate.py is for CPU weights: on CUDA no 4-bit forward is swapped during generate."""
    import bitsandbytes as bnb

    from slimrl.models.dequantized_generate import cpu_4bit_layers

    model = _qlora(tiny_model_dir, "bfloat16", False)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and cpu_4bit_layers(model) == []
    swapped = []
    hooks = [m.register_forward_pre_hook(lambda m, a: swapped.append("forward" in vars(m))) for m in layers]
    with torch.no_grad():
        model.generate(input_ids=batch()["input_ids"][:, :4].cuda(), max_new_tokens=2, do_sample=False)
    for hook in hooks:
        hook.remove()
    assert swapped and not any(swapped)
