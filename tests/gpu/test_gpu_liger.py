"""Liger-Kernel's RMSNorm, RoPE and SwiGLU (slimrl.models.liger) on CUDA: a tiny Llama and a tiny Qwen2 with LoRA,
the loss and every adapter gradient with the kernels on against the eager model, judged against a float64 eager
reference of the same model (the fused-LoRA rule: e(Liger) <= 2 e(eager) + 4 u |ref|, norm-relative, per tensor);
its negative control (one norm weight 1% off must fail); restore_liger giving back the eager model, bit for bit.
Skipped without CUDA or without liger-kernel (scripts/gpu_wheels.sh carries its wheel)."""

import copy
import importlib.util

import pytest
import torch

from slimrl import FastLanguageModel, swaps
from slimrl.models import liger

from _gpu_helpers import MARKS

pytestmark = [
    *MARKS,
    pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel not installed"),
]
SHAPES = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
)


def _base(kind: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config = (LlamaConfig if kind == "llama" else Qwen2Config)(**SHAPES)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to("cuda")


def _peft(kind: str, liger_kernel):
    model = FastLanguageModel.get_peft_model(
        _base(kind),
        r=4,
        lora_alpha=8,
        init_lora_weights=False,
        use_gradient_checkpointing=False,
        fused_lora=False,
        liger_kernel=liger_kernel,
    )
    return model


def _run(model):
    model.zero_grad(set_to_none=True)
    ids = torch.randint(3, SHAPES["vocab_size"], (3, 37), generator=torch.Generator().manual_seed(0)).to("cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach().double(), **grads}


def _errors(out, ref) -> dict:
    return {k: ((out[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30)).item() for k in ref}


def _compare(kind: str, norm_scale: float = 1.0) -> list:
    """The tensors breaking the rule. The eager runs come first: the RoPE dispatcher is process-wide."""
    eager = _peft(kind, False)
    reference = _run(copy.deepcopy(eager).double())
    e_eager = _errors(_run(eager), reference)
    fast = _peft(kind, True)
    assert liger.kernels_on(fast) == 2 * 2 + 1 + 2  # 4 norms in the layers, the final norm, 2 MLPs
    if norm_scale != 1.0:
        with torch.no_grad():
            fast.get_base_model().model.norm.weight.mul_(norm_scale)
    try:
        e_fast = _errors(_run(fast), reference)
    finally:
        liger.restore_liger(fast)
    u = torch.finfo(torch.float32).eps / 2
    return [k for k in reference if e_fast[k] > 2 * e_eager[k] + 4 * u]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_liger_matches_the_eager_model_on_cuda(kind):
    assert _compare(kind) == []


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_negative_control_a_norm_weight_off_fails(kind):
    assert _compare(kind, norm_scale=1.01)


def test_restore_gives_back_the_eager_model():
    first = _run(_peft("qwen2", False))
    fast = _peft("qwen2", True)
    assert any(name.endswith("modeling_qwen2.apply_rotary_pos_emb") for name in swaps.swapped_modules())
    liger.restore_liger(fast)
    assert liger.kernels_on(fast) == 0 and swaps.swapped_modules() == {}
    second = _run(fast)
    assert all(torch.equal(first[k], second[k]) for k in first)
