"""Row groups, padding-free forwards and the tiled MLP on CUDA: the CPU suite's GRPO/RLOO harness, fp32, with the
long-context fields on the patched side (tests/patches/scoring/test_row_groups.py holds the CPU cases); the tiled MLP's
backward replaying CUDA dropout draws; the automatic group size read from the device's free memory."""

import pytest
import torch

from slimrl.models.tiled_mlp import tiled_mlp_state
from slimrl.ops import row_groups as rg
from slimrl.ops import tiled_mlp as op
from slimrl.patches.scoring import padding_free as PF
from slimrl.patches.scoring import row_groups as RG

from _gpu_helpers import HARNESS, MARKS, cuda_config, lora_config, report, tiny_model

pytestmark = MARKS

CASES = {
    "grpo-lora-dapo-ref-iters2-rows1-tiled": (
        "grpo",
        dict(loss_type="dapo", beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2),
        dict(slimrl_rows_per_group=1, slimrl_tiled_mlp=3, slimrl_padding_free=True),
    ),
    "grpo-lora-grpo-seq-rows2": (
        "grpo",
        dict(
            loss_type="grpo",
            importance_sampling_level="sequence",
            num_iterations=2,
            per_device_train_batch_size=6,
            num_generations=3,
        ),
        dict(slimrl_rows_per_group=2),
    ),
    "rloo-lora-iters2-rows1": (
        "rloo",
        dict(num_iterations=2, per_device_train_batch_size=4, num_generations=2),
        dict(slimrl_rows_per_group=1, slimrl_tiled_mlp=4),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_parity_with_long_context_fields(tmp_path, unpatched, case):
    algorithm, config, patched = CASES[case]
    harness = HARNESS[algorithm]
    trainers = harness.build_sides(
        algorithm, tiny_model, dict(config, **cuda_config("fp32")), str(tmp_path), lora_config(), patched_config=patched
    )
    assert next(trainers.patched.model.parameters()).is_cuda
    traces = harness.run_sides(algorithm, trainers)
    harness.assert_traces_match(traces)
    stats = RG.row_group_stats(trainers.patched)
    assert stats.grouped_steps > 0, stats
    if patched.get("slimrl_padding_free"):
        assert PF.padding_free_stats(trainers.patched).trimmed_calls > 0
    if patched.get("slimrl_tiled_mlp"):
        assert tiled_mlp_state(trainers.patched.model).tiled_calls > 0
    report(case, groups=stats.groups, steps=stats.grouped_steps)


def test_tiled_backward_replays_cuda_dropout():
    torch.manual_seed(0)
    mlp = tiny_model().model.layers[0].mlp.cuda()
    dropout = torch.nn.Dropout(0.5)

    def run(t):
        return mlp.down_proj(mlp.act_fn(mlp.gate_proj(dropout(t))) * mlp.up_proj(t))

    hidden = mlp.gate_proj.in_features
    x = torch.randn(2, 9, hidden, device="cuda", requires_grad=True)
    params = [p for p in mlp.parameters() if p.requires_grad]
    torch.manual_seed(5)
    out = op.tiled_mlp(run, x, params, 4)
    out.sum().backward()
    torch.manual_seed(5)
    x2 = x.detach().clone().requires_grad_(True)
    flat = x2.reshape(-1, hidden)
    expected = torch.cat([run(flat[s:e]) for s, e in op.shard_bounds(flat.shape[0], 4)])
    expected.sum().backward()
    torch.testing.assert_close(out.reshape(-1, hidden), expected)
    torch.testing.assert_close(x.grad, x2.grad)


def test_auto_group_tokens_reads_cuda_free_memory():
    device = torch.device("cuda")
    free = rg.free_memory_bytes(device)
    assert 0 < free <= torch.cuda.get_device_properties(0).total_memory
    assert rg.auto_group_tokens(tiny_model().config, 2, True, device) == rg.AUTO_GROUP_TOKENS
