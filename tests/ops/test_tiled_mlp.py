"""slimrl.ops.tiled_mlp and the swap of slimrl.models.tiled_mlp: a decoder MLP run in token shards gives the untiled
MLP's outputs and gradients (input, LoRA and base weights) by the parity rule of tests/patches/_parity.py, inside
checkpointed layers too; dropout draws are replayed in the backward; the swap is recorded, reversible and only acts
above its threshold. Negative control: a backward that skips a shard's parameter gradient fails the comparison.
"""

from __future__ import annotations

import copy

import pytest
import torch

from slimrl.models import tiled_mlp as swap
from slimrl.ops import tiled_mlp as op
from slimrl.state import model_state
from slimrl.testing import tiny_llama

import _parity as P


def _mlp(seed=0, hidden=24, intermediate=40):
    model = tiny_llama(seed=seed, vocab_size=64, hidden_size=hidden, num_layers=1, intermediate_size=intermediate)
    return model.model.layers[0].mlp


def _grads(mlp, x, upstream, tile: int | None):
    x = x.clone().requires_grad_(True)
    params = [p for p in mlp.parameters() if p.requires_grad]
    out = mlp(x) if tile is None else op.tiled_mlp(mlp, x, params, tile)
    out.backward(upstream)
    return out.detach(), x.grad, [p.grad.clone() for p in params]


def _compare(what, tile, mlp_factory, x, upstream):
    stock, ours = mlp_factory(), mlp_factory()
    reference = copy.deepcopy(stock).double()
    got = _grads(ours, x, upstream, tile)
    want = _grads(stock, x, upstream, None)
    exact = _grads(reference, x.double(), upstream.double(), None)
    for name, g, w, r in zip(("output", "input grad"), got, want, exact):
        P.check(f"{what}: {name}", g, w, r)
    for i, (g, w, r) in enumerate(zip(got[2], want[2], exact[2])):
        P.check(f"{what}: param grad {i}", g, w, r)


@pytest.mark.parametrize("tile", [1, 5, 7, 64])
def test_tiled_matches_untiled(tile):
    g = torch.Generator().manual_seed(1)
    x, upstream = torch.randn(3, 11, 24, generator=g), torch.randn(3, 11, 24, generator=g)
    _compare(f"tile {tile}", tile, _mlp, x, upstream)


def test_lora_mlp_frozen_base():
    from peft import LoraConfig, get_peft_model

    def factory():
        model = tiny_llama(seed=0, vocab_size=64, hidden_size=24, num_layers=1, intermediate_size=40)
        config = LoraConfig(r=4, target_modules=["gate_proj", "down_proj"], init_lora_weights=False)
        torch.manual_seed(3)
        return get_peft_model(model, config).base_model.model.model.layers[0].mlp

    g = torch.Generator().manual_seed(2)
    x, upstream = torch.randn(2, 9, 24, generator=g), torch.randn(2, 9, 24, generator=g)
    assert sum(p.requires_grad for p in factory().parameters()) == 4  # only the LoRA matrices
    _compare("lora", 4, factory, x, upstream)


def test_dropout_draws_replayed_in_backward():
    """With dropout inside the MLP the backward recomputes each shard with the forward's masks: the gradient equals
    the one of an untiled call that sees the same masks (each shard's masks drawn in order from the same state)."""
    torch.manual_seed(0)
    mlp = _mlp()
    mlp.train()
    dropout = torch.nn.Dropout(0.5)

    def run(t):
        return mlp.down_proj(mlp.act_fn(mlp.gate_proj(dropout(t))) * mlp.up_proj(t))

    x = torch.randn(1, 12, 24, requires_grad=True)
    params = [p for p in mlp.parameters() if p.requires_grad]
    torch.manual_seed(5)
    out = op.tiled_mlp(run, x, params, 4)
    out.sum().backward()
    torch.manual_seed(5)  # the same draws, shard by shard, untiled
    x2 = x.detach().clone().requires_grad_(True)
    flat = x2.reshape(-1, 24)
    expected = torch.cat([run(flat[s:e]) for s, e in op.shard_bounds(12, 4)])
    expected.sum().backward()
    torch.testing.assert_close(out.reshape(-1, 24), expected)
    torch.testing.assert_close(x.grad, x2.grad)


def test_checkpointed_layer_and_no_grad():
    """Inside a checkpointed decoder layer (the recompute runs the tiled forward again), and without grad."""
    model = tiny_llama(seed=0, vocab_size=64, hidden_size=24, num_layers=2, intermediate_size=40)
    stock = copy.deepcopy(model)
    swap.tile_mlp(model, 3)
    ids = torch.randint(3, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    for m in (model, stock):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
    reference = copy.deepcopy(stock).double()
    losses = [m(input_ids=ids, labels=ids).loss for m in (model, stock, reference)]
    for loss in losses:
        loss.backward()
    P.check("loss", *(x.detach() for x in losses))
    for (name, p), q, r in zip(model.named_parameters(), stock.parameters(), reference.parameters()):
        P.check(f"grad {name}", p.grad, q.grad, r.grad)
    state = swap.tiled_mlp_state(model)
    assert state.tiled_calls == 4 and len(state.modules) == 2  # 2 layers x (forward + recompute)
    with torch.no_grad():
        P.check(
            "no-grad logits", model(input_ids=ids).logits, stock(input_ids=ids).logits, reference(input_ids=ids).logits
        )
    assert state.sharded_calls == 2


def test_swap_recorded_reversible_and_thresholds():
    model = tiny_llama(seed=0, vocab_size=64, hidden_size=24, num_layers=2, intermediate_size=40)
    mlps = [layer.mlp for layer in model.model.layers]
    assert [m for _, m in swap.tileable_mlps(model)] == mlps
    swap.tile_mlp(model, True)
    state = model_state(model).tiled_mlp
    assert state.modules == mlps and all("forward" in m.__dict__ for m in mlps)
    assert state.shard_tokens(24, 4) is None and state.shard_tokens(25, 4) == 24  # True: shards of hidden_size
    swap.tile_mlp(model, 8)  # another setting: only the setting changes
    assert model_state(model).tiled_mlp is state and state.shard_tokens(9, 4) == 8 and state.shard_tokens(8, 4) is None
    swap.tile_mlp(model, "auto")
    threshold = swap.auto_threshold_tokens(40, 4)
    assert threshold == swap.AUTO_TILE_BYTES // (swap.MLP_TRANSIENT_TENSORS * 40 * 4)
    assert state.shard_tokens(threshold - 1, 4) is None and state.shard_tokens(threshold, 4) == 24
    # Qwen2.5-7B in bf16 and SmolLM2-135M in fp32, as the module docstring says
    assert 28_000 < swap.auto_threshold_tokens(18944, 2) < 29_000
    assert 174_000 < swap.auto_threshold_tokens(1536, 4) < 176_000
    swap.tile_mlp(model, False)
    assert model_state(model).tiled_mlp is None and not any("forward" in m.__dict__ for m in mlps)
    for bad in (0, -3, "yes", 2.5):
        with pytest.raises(ValueError, match="slimrl_tiled_mlp"):
            swap.validate_tiled_mlp(bad)


def test_skipped_shard_gradient_fails_parity(monkeypatch):
    """Negative control: a backward that drops the parameter gradient of one shard must fail the comparison."""
    real_grad = torch.autograd.grad
    calls = []

    def dropping(outputs, inputs, *args, **kwargs):
        grads = real_grad(outputs, inputs, *args, **kwargs)
        calls.append(1)
        return (grads[0], *(torch.zeros_like(g) for g in grads[1:])) if len(calls) == 2 else grads

    monkeypatch.setattr(op.torch.autograd, "grad", dropping)
    g = torch.Generator().manual_seed(1)
    x, upstream = torch.randn(3, 11, 24, generator=g), torch.randn(3, 11, 24, generator=g)
    with pytest.raises(AssertionError, match="param grad"):
        _compare("control", 5, _mlp, x, upstream)


def test_sharded_parameters_left_untiled_under_auto_refused_when_forced():
    model = tiny_llama(seed=0, vocab_size=64, hidden_size=24, num_layers=1, intermediate_size=40)
    mlp = model.model.layers[0].mlp
    mlp.gate_proj.weight.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    x = torch.randn(1, 30, 24)
    swap.tile_mlp(model, 4)
    with pytest.raises(ValueError, match="ZeRO-3"):
        mlp(x)
    swap.tile_mlp(model, "auto")
    state = swap.tiled_mlp_state(model)
    state.intermediate = 10**12  # "auto" would tile any call longer than hidden_size
    torch.testing.assert_close(mlp(x), type(mlp).forward(mlp, x))
    assert state.tiled_calls == state.sharded_calls == 0
