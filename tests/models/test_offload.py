"""Activation offload ("offload" checkpointing): exact values, the host pool reused, the newest input kept, the size
threshold, prefetch order, graphs of their own (row groups), and a patched GRPO step.

On CPU the offloader leaves host tensors in place; `configure_offload(host_tensors=True)` sends them through the same
path the CUDA engine takes (synchronous copies into a plain host pool), so every bookkeeping rule runs here.
"""

import copy
import pickle

import pytest
import torch

from slimrl.models.checkpointing import apply_checkpointing, base_transformers_model, configure_offload
from slimrl.models.offload import ActivationOffloader
from slimrl.state import model_state
from slimrl.testing import tiny_llama

LAYERS, ROWS, LENGTH, WIDTH = 4, 2, 12, 32
INPUT_BYTES = ROWS * LENGTH * WIDTH * 4  # one layer input, fp32


def lora_model(mode, layers=LAYERS, dtype=torch.float32, **offload):
    from slimrl import FastLanguageModel

    model = tiny_llama(seed=0, hidden_size=WIDTH, num_layers=layers, dtype=dtype)
    model = FastLanguageModel.get_peft_model(
        model, r=4, lora_alpha=8, use_gradient_checkpointing=mode, random_state=1, init_lora_weights=False
    )
    if mode == "offload":
        configure_offload(model, **{"host_tensors": True, "min_bytes": 0, **offload})
    return model.train()


def offloader_of(model) -> ActivationOffloader:
    return model_state(base_transformers_model(model)).offloader


def ids(length=LENGTH, seed=0):
    return torch.randint(4, 512, (ROWS, length), generator=torch.Generator().manual_seed(seed))


def lora_grads(model, *batches) -> dict:
    """Gradients of the summed losses of `batches`, each its own forward and backward (graph)."""
    model.zero_grad(set_to_none=True)
    for batch in batches:
        model(input_ids=batch, labels=batch).loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_bitwise_equal(actual: dict, expected: dict):
    assert actual.keys() == expected.keys() and expected
    for name, grad in expected.items():
        assert torch.equal(actual[name], grad), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_bitwise_those_of_plain_checkpointing(dtype):
    plain = lora_grads(lora_model(True, dtype=dtype), ids())
    model = lora_model("offload", dtype=dtype)
    assert_bitwise_equal(lora_grads(model, ids()), plain)
    stats = offloader_of(model).stats
    assert stats.tensors_moved == LAYERS - 1 and stats.bytes_moved == (LAYERS - 1) * INPUT_BYTES * dtype.itemsize // 4


def test_negative_control_a_changed_host_copy_changes_the_gradients():
    plain = lora_grads(lora_model(True), ids())
    model = lora_model("offload")
    offloader = offloader_of(model)
    lora_grads(model, ids())  # builds the engine
    engine = offloader.engines[torch.device("cpu")]
    exact_copy = engine.copy
    engine.copy = lambda dst, src: (exact_copy(dst, src), dst.mul_(1 + 2**-20))[0]
    grads = lora_grads(model, ids())
    assert any(not torch.equal(grads[n], g) for n, g in plain.items())


def test_newest_input_kept_the_rest_prefetched_in_backward_order():
    model = lora_model("offload")
    stats = offloader_of(model).stats
    lora_grads(model, ids())
    assert stats.tensors_seen == LAYERS and stats.kept_last == 1 and stats.tensors_moved == LAYERS - 1
    assert stats.prefetched == LAYERS - 1 and stats.fetched_on_demand == 0  # each arrived before it was asked for


@pytest.mark.parametrize("keep_last", [0, 2])
def test_keep_last_setting(keep_last):
    plain = lora_grads(lora_model(True), ids())
    model = lora_model("offload", keep_last=keep_last)
    assert_bitwise_equal(lora_grads(model, ids()), plain)
    stats = offloader_of(model).stats
    assert stats.kept_last == keep_last and stats.tensors_moved == LAYERS - keep_last
    assert stats.fetched_on_demand == (1 if keep_last == 0 else 0)  # keep none: the first one back is waited for


def test_size_threshold():
    model = lora_model("offload", min_bytes=INPUT_BYTES + 1)
    offloader = offloader_of(model)
    lora_grads(model, ids())
    assert offloader.stats.kept_small == LAYERS and offloader.stats.tensors_moved == 0
    assert offloader.host_memory()["buffers"] == 0
    configure_offload(model, min_bytes=INPUT_BYTES)  # a tensor of exactly min_bytes moves
    lora_grads(model, ids())
    assert offloader.stats.tensors_moved == LAYERS - 1


def test_host_tensors_stay_in_place_by_default():
    from slimrl import FastLanguageModel

    model = FastLanguageModel.get_peft_model(
        tiny_llama(seed=0, hidden_size=WIDTH, num_layers=LAYERS), r=4, use_gradient_checkpointing="offload"
    ).train()
    offloader = offloader_of(model)
    assert (offloader.min_bytes, offloader.keep_last, offloader.host_tensors) == (2**20, 1, False)
    lora_grads(model, ids())
    assert offloader.stats.kept_other == LAYERS and offloader.stats.tensors_moved == 0 and not offloader.engines


def test_host_pool_reused_across_steps_and_replaced_not_grown():
    model = lora_model("offload")
    offloader = offloader_of(model)
    lora_grads(model, ids())
    first = offloader.host_memory()
    assert first["buffers"] == LAYERS - 1 and first["free"] == first["buffers"]  # all back after the backward
    for seed in range(1, 4):
        lora_grads(model, ids(seed=seed))
    assert offloader.host_memory() == first  # same shapes: not one new allocation
    lora_grads(model, ids(length=8 * LENGTH))  # longer rows: too-small buffers are replaced
    longer = offloader.host_memory()
    assert longer["buffers"] == LAYERS - 1 and longer["allocations"] == first["allocations"] + LAYERS - 1
    lora_grads(model, ids(length=LENGTH // 2), ids())  # shorter rows fit the buffers there are
    assert offloader.host_memory() == longer


def test_graphs_of_their_own_interleaved_or_in_turn():
    """Row groups: each group's forward and backward its own graph, in turn or with the forwards first."""
    groups = (ids(seed=1), ids(length=LENGTH + 4, seed=2))
    plain = lora_grads(lora_model(True), *groups)
    model = lora_model("offload")
    assert_bitwise_equal(lora_grads(model, *groups), plain)
    model.zero_grad(set_to_none=True)
    losses = [model(input_ids=g, labels=g).loss for g in groups]
    for loss in losses:  # the first graph's backward runs after the second forward
        loss.backward()
    assert_bitwise_equal({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, plain)
    memory = offloader_of(model).host_memory()
    # both graphs alive at once (the first one's newest input left when the second forward began), then all back
    assert memory["free"] == memory["buffers"] == 2 * LAYERS - 1


def test_a_graph_freed_without_backward_gives_its_buffers_back():
    model = lora_model("offload")
    offloader = offloader_of(model)
    loss = model(input_ids=ids(), labels=ids()).loss
    assert offloader.host_memory()["free"] == 0
    del loss
    memory = offloader.host_memory()
    assert memory["buffers"] == LAYERS - 1 and memory["free"] == LAYERS - 1


def _layer(x):
    return (x * 2).sin()


@pytest.mark.parametrize("modified", [0, 1])  # the kept input, or one already in host memory
def test_an_input_changed_in_place_raises_as_plain_checkpointing_does(modified):
    from torch.utils.checkpoint import checkpoint

    from slimrl.models.checkpointing import offloaded_checkpoint

    offloader = ActivationOffloader(min_bytes=0, host_tensors=True)
    inputs = [torch.randn(4, 4, requires_grad=True) * 1 for _ in range(2)]
    out = sum(offloaded_checkpoint(offloader, {"use_reentrant": False}, _layer, x).sum() for x in inputs)
    inputs[1 - modified].add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.backward()
    plain_inputs = [torch.randn(4, 4, requires_grad=True) * 1 for _ in range(2)]
    plain = sum(checkpoint(_layer, x, use_reentrant=False).sum() for x in plain_inputs)
    plain_inputs[0].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        plain.backward()


def test_settings_checked_and_carried_by_deepcopy_and_pickle():
    model = lora_model("offload", keep_last=2, min_bytes=64)
    for bad in ({"min_bytes": -1}, {"keep_last": True}, {"keep_last": 1.5}, {"host_tensors": "yes"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            configure_offload(model, **bad)
    offloader = offloader_of(model)
    assert (offloader.min_bytes, offloader.keep_last, offloader.host_tensors) == (64, 2, True)  # nothing changed
    lora_grads(model, ids())
    clone = copy.deepcopy(model)
    cloned = offloader_of(clone)
    assert cloned is not offloader and (cloned.min_bytes, cloned.keep_last, cloned.host_tensors) == (64, 2, True)
    assert cloned.stats.tensors_seen == 0 and not cloned.engines  # no buffers or streams travel
    layer = base_transformers_model(clone).model.layers[0]
    assert layer._gradient_checkpointing_func.args[0] is cloned  # the clone's layers use the clone's offloader
    restored = pickle.loads(pickle.dumps(model_state(base_transformers_model(model))))
    assert restored.offloader.keep_last == 2 and restored.offload_stats.tensors_seen == 0


def test_patched_grpo_step_with_lora_equals_plain_checkpointing(tmp_path):
    import _rl_parity as R
    import _tiny as T
    from _parity import patched_state, trainable

    results = {}
    for mode in (True, "offload"):
        with patched_state("grpo"):
            model = apply_checkpointing(T.tiny_model(0), mode)
            if mode == "offload":
                configure_offload(model, min_bytes=0, host_tensors=True)
            args = R.make_config("grpo", str(tmp_path), gradient_checkpointing=True)
            trainer = R.build_trainer("grpo", model, args, T.lora_config())
            torch.manual_seed(1)
            loss = trainer.training_step(trainer.model, R.generation_batch(args), None)
        grads = {n: p.grad.detach().clone() for n, p in trainable(trainer.model).items()}
        results[mode] = (float(loss), grads, offloader_of(trainer.model))
    assert results["offload"][0] == results[True][0]
    assert_bitwise_equal(results["offload"][1], results[True][1])
    stats = results["offload"][2].stats
    assert stats.tensors_moved == stats.prefetched > 0 and stats.kept_last > 0 and stats.fetched_on_demand == 0


def test_a_host_allocation_failure_is_an_out_of_memory_naming_the_pool():
    from slimrl.models.offload import HostPool
    from slimrl.training.oom import is_out_of_memory

    pool = HostPool(pinned=False)
    pool.acquire(100)  # lent out, never released
    free = pool.acquire(100)
    pool.release(free)  # too small for the next request: replaced, so the pool is left with the lent one
    with pytest.raises(torch.OutOfMemoryError, match=r"could not allocate .* host memory .* in 1 buffer\(s\)") as exc:
        pool.acquire(1 << 60)  # more than any machine has: the allocator refuses at once
    assert is_out_of_memory(exc.value) and "use_gradient_checkpointing=True" in str(exc.value)
