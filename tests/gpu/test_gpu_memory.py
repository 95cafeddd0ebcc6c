"""GPU memory: the "offload" checkpointing mode holds the saved layer inputs in host memory (device peak below plain
checkpointing, same gradients, and it acts inside a patched TRL trainer), and `peak_memory_gb` is CUDA's max allocated
read at the step's end, never reset: a user's own whole-run reading keeps a peak made before the step."""

import pytest
import torch

from slimrl.models.checkpointing import apply_checkpointing, base_transformers_model, configure_offload
from slimrl.state import model_state
from slimrl.testing import tiny_llama

from _gpu_helpers import (
    MARKS,
    cuda_config,
    dpo_step,
    dpo_trainer,
    grpo_step,
    grpo_trainer,
    patched_state,
    rel_err,
    report,
    tiny_model,
)

pytestmark = MARKS

GiB = 1024**3
# Long, narrow and deep: the checkpointed layer inputs (16 x 8 x 4096 x 256 fp32 = 512 MiB) dominate the peak
ROWS, SEQ, WIDTH, LAYERS = 8, 4096, 256, 16


def _deep_model(mode):
    model = tiny_llama(
        seed=0,
        vocab_size=512,
        hidden_size=WIDTH,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=SEQ,
    ).cuda()
    return apply_checkpointing(model, mode).train()


def _step_peak(model, ids) -> tuple[int, dict]:
    """Device memory a forward + backward adds on top of what was allocated before it, and the gradients."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return peak, grads


def test_offload_peak_below_plain_checkpointing_with_the_same_gradients():
    ids = torch.randint(4, 512, (ROWS, SEQ), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    plain_peak, plain_grads = _step_peak(_deep_model(True), ids)
    offload_model = _deep_model("offload")
    offload_peak, offload_grads = _step_peak(offload_model, ids)
    stats = model_state(base_transformers_model(offload_model)).offload_stats
    layer_input = ROWS * SEQ * WIDTH * 4
    report(
        "offload peak",
        plain_mib=plain_peak / 2**20,
        offload_mib=offload_peak / 2**20,
        moved_mib=stats.bytes_moved / 2**20,
    )
    # every layer's input left but the newest one (its backward comes first)
    assert stats.tensors_moved == LAYERS - 1 and stats.bytes_moved == (LAYERS - 1) * layer_input
    assert stats.kept_last == 1
    # plain checkpointing holds all 16 layer inputs at the backward's start, offload about one: require half of them
    assert offload_peak <= plain_peak - (LAYERS // 2) * layer_input, (offload_peak, plain_peak)
    for name, grad in plain_grads.items():
        assert rel_err(offload_grads[name], grad) <= 1e-6, name


def test_offload_moves_activations_inside_a_patched_grpo_step(tmp_path, unpatched):
    with patched_state("grpo"):
        model = apply_checkpointing(tiny_model(), "offload")
        configure_offload(model, min_bytes=0)  # the tiny model's layer inputs are far under the 1 MiB default
        trainer = grpo_trainer(str(tmp_path), model, gradient_checkpointing=True, **cuda_config("fp32"))
        grpo_step(trainer)
    stats = model_state(base_transformers_model(trainer.model)).offload_stats
    assert model_state(trainer.model).checkpointing == "offload"
    assert stats.tensors_moved > 0 and stats.bytes_moved > 0  # on CUDA the saved inputs go to host memory


def _one_step(algorithm: str, out_dir: str):
    """A patched trainer of `algorithm` on the GPU, and a closure running one training_step of it (the trainer's own
    step only: copying gradients afterwards, as the parity harness does, could raise the peak read after it)."""
    if algorithm == "grpo":
        trainer = grpo_trainer(out_dir, **cuda_config("fp32"))
        return trainer, lambda: grpo_step(trainer)
    trainer = dpo_trainer(out_dir, **cuda_config("fp32"))
    return trainer, lambda: dpo_step(trainer)


@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
@pytest.mark.parametrize("reset_first", [False, True])
def test_peak_memory_metric_reads_the_users_cuda_peak_without_resetting_it(algorithm, reset_first, tmp_path, unpatched):
    """A 1 GiB peak made before the step stays in `torch.cuda.max_memory_allocated()` after it, and the metric is that
    reading. Negative control (`reset_first`): a reset at the step's start, what the metric used to do, loses it."""
    with patched_state(algorithm):
        trainer, step = _one_step(algorithm, str(tmp_path))
        spike = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        del spike
        torch.cuda.synchronize()
        high = torch.cuda.max_memory_allocated()
        if reset_first:
            torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        after = torch.cuda.max_memory_allocated()
    logged = trainer._metrics["train"]["peak_memory_gb"][-1]
    report(f"peak_memory_gb {algorithm} reset_first={reset_first}", logged=logged, users_reading_gib=after / GiB)
    assert logged == pytest.approx(after / GiB, abs=1e-4)
    if reset_first:
        assert after < high - GiB // 2  # the check below can tell a reset
    else:
        assert after >= high  # the user's whole-run reading still holds the peak before the step
