"""The planner's long-context levers (slimrl.planning.levers): row groups shrink what one policy forward and backward
holds, the tiled MLP shrinks the block recompute to one MLP shard, offload keeps two block inputs on the device; each
read through the lever's own rules where this slimrl has them (tests marked `needs_levers` skip, saying so, where it
has not)."""

import dataclasses
import functools

import pytest

from slimrl.planning import levers, plan
from slimrl.planning import terms as T
from slimrl.planning.run import run_shape
from slimrl.planning.shapes import model_shape
from slimrl.testing import tiny_llama_config

needs_levers = pytest.mark.skipif(
    not levers.available(),
    reason="this slimrl has no row groups or tiled MLP (slimrl.ops.row_groups, slimrl.models.tiled_mlp)",
)
QWEN_7B = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    tie_word_embeddings=False,
)
LONG = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=8192, bf16=True)


@functools.cache
def _shape():
    return model_shape(tiny_llama_config(**QWEN_7B), lora_rank=16)


def _run(**fields):
    stock = {"slimrl_rows_per_group": False, "slimrl_tiled_mlp": False} if levers.available() else {}
    return run_shape("grpo", {**LONG, **stock, **fields}, prompt_length=14, dtype="bfloat16", device="cuda")


def test_a_group_of_rows_holds_that_share_of_the_policy_activations():
    shape, whole = _shape(), _run()
    group = dataclasses.replace(whole, group_rows=2)
    assert whole.policy_rows == 8 and group.policy_rows == 2
    for term in (T.saved_activations, T.recompute):
        assert term(shape, group).bytes * 4 == pytest.approx(term(shape, whole).bytes, rel=1e-9)
    assert (
        T.head_backward(shape, group, T.scored_tokens(group)).bytes
        < T.head_backward(shape, whole, T.scored_tokens(whole)).bytes
    )


def test_offload_keeps_two_block_inputs_on_the_device_and_pools_the_rest():
    shape = _shape()
    kept, offloaded = _run(), dataclasses.replace(_run(), checkpointing="offload")
    tokens = T.policy_tokens(kept)
    assert T.saved_activations(shape, kept).bytes == 28 * tokens * 3584 * 2
    assert T.saved_activations(shape, offloaded).bytes == 2 * tokens * 3584 * 2  # in use, and the next
    block_input = tokens * 3584 * 2  # 470 MB: the offloader's pool rounds each buffer up to 512 MiB
    assert T.offloaded_inputs(shape, offloaded).bytes == 27 * 512 * 2**20 > 27 * block_input


def test_the_recompute_counts_the_mlps_gradients():
    shape, run = _shape(), _run()
    tokens = T.policy_tokens(run)
    grads = T.MLP_GRADIENTS * 18944 * 2
    assert T.recompute(shape, run).bytes == tokens * (T.per_token_layer_bytes(shape, run) + grads)
    assert T.mlp_token_bytes(shape, run) < T.per_token_layer_bytes(shape, run)


@needs_levers
def test_auto_groups_follow_the_row_groups_token_budget():
    from slimrl.ops.row_groups import AUTO_GROUP_TOKENS

    assert _run(slimrl_rows_per_group="auto").group_rows == 1  # 8206-token rows: one a group
    short = max(AUTO_GROUP_TOKENS // 4 - 14, 1)  # rows of a quarter of the budget: four a group
    assert _run(slimrl_rows_per_group="auto", max_completion_length=short).group_rows == 4
    assert _run(slimrl_rows_per_group=3).group_rows == 3
    assert _run(slimrl_rows_per_group=False).policy_rows == 8


@needs_levers
def test_tiled_mlp_leaves_one_shard_of_the_mlp_in_the_recompute():
    from slimrl.models.tiled_mlp import auto_threshold_tokens

    shape = _shape()
    threshold = auto_threshold_tokens(18944, 2)
    untiled = _run(slimrl_tiled_mlp=False, max_completion_length=threshold)
    auto = _run(slimrl_tiled_mlp="auto", max_completion_length=threshold)  # one row of the threshold or more a group
    assert levers.mlp_shard_tokens("auto", 3584, 18944, threshold + 14, 2) == 3584
    assert levers.mlp_shard_tokens("auto", 3584, 18944, 8192, 2) == 0  # below the threshold: untiled
    tiled, whole = T.recompute(shape, auto).bytes, T.recompute(shape, untiled).bytes
    tokens = T.policy_tokens(untiled)
    mlp = T.mlp_token_bytes(shape, untiled) + T.MLP_GRADIENTS * 18944 * 2
    assert whole - tiled == (tokens - 3584) * mlp - tokens * 3584 * 2  # the shard's MLP share, the input kept whole


@needs_levers
def test_slimrl_defaults_plan_less_than_stock_at_8_rows_of_8k():
    config = tiny_llama_config(**QWEN_7B)
    common = dict(prompt_length=14, lora_r=16, dtype="bfloat16", device="cuda", device_memory_gb=80)
    stock = plan(config, {**LONG, "slimrl_rows_per_group": False, "slimrl_tiled_mlp": False}, "grpo", **common)
    slimrl = plan(config, LONG, "grpo", **common)
    assert (
        slimrl.run.group_rows == 1 and slimrl.phase_bytes("policy backward") < stock.phase_bytes("policy backward") / 4
    )
