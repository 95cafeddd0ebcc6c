"""GPU activation offload: copies run on the side stream beside the compute (transformers' offload, on the compute
stream, is the negative control), gradients equal plain checkpointing's, the device peak falls, the host pool is
reused, and the step time of plain checkpointing, slimrl's offload and transformers' offload is measured and
reported (never asserted: speed targets live in bench/)."""

import time

import torch

from slimrl.models.checkpointing import apply_checkpointing, base_transformers_model
from slimrl.state import model_state
from slimrl.testing import tiny_llama

from _gpu_helpers import MARKS, rel_err, report

pytestmark = MARKS

# Wide enough that a layer's compute outweighs its copies (as in 7B-class models), small enough for a step in well under
# a second: a layer input is ROWS x SEQ x WIDTH bf16 = 64 MiB. Only the norms train (LoRA-like: no weight gradients
# of the big matrices), so the layer inputs, not gradients, are what checkpointing holds at the backward's start.
ROWS, SEQ, WIDTH, INTERMEDIATE, LAYERS = 4, 4096, 2048, 8192, 6
LAYER_INPUT = ROWS * SEQ * WIDTH * 2
TIMED_STEPS = 5


def _model(mode):
    """bf16, the norms trained; mode True / "offload" (slimrl) / "transformers" (save_on_cpu, compute stream)."""
    model = tiny_llama(
        seed=0,
        dtype=torch.bfloat16,
        vocab_size=512,
        hidden_size=WIDTH,
        intermediate_size=INTERMEDIATE,
        num_layers=LAYERS,
        num_heads=16,
        num_kv_heads=4,
        max_position_embeddings=SEQ,
    ).cuda()
    for name, param in model.named_parameters():
        param.requires_grad_("norm" in name)
    if mode == "transformers":  # transformers >= 5.23 names it activation_checkpointing_enable (5.17-5.22: gradient_)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False}, offload=True)
    else:
        apply_checkpointing(model, mode)
    return model.train()


def _ids():
    return torch.randint(4, 512, (ROWS, SEQ), device="cuda", generator=torch.Generator("cuda").manual_seed(0))


def _step(model, ids):
    model(input_ids=ids, labels=ids).loss.backward()


def _grads_and_peak(model, ids):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(model, ids)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads, peak


def _device_events(model, ids):
    """The CUDA activities (kernels, copies) of one forward + backward: (name, stream, start_us, end_us)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    _step(model, ids)  # warm: the host pool and the allocator are filled
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(model, ids)
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return [
        (e.name, e.device_resource_id, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]


def _copy_placement(events) -> tuple[float, float]:
    """Of the host<->device copy time: the fraction on streams that also ran kernels (the compute streams), and the
    fraction during which some kernel ran. Small copies the model itself makes (masks, positions) weigh little."""
    copies = [e for e in events if "Memcpy" in e[0] and ("DtoH" in e[0] or "HtoD" in e[0])]
    kernels = [e for e in events if "Memcpy" not in e[0] and "Memset" not in e[0]]
    kernel_streams = {stream for _, stream, _, _ in kernels}
    merged = []
    for start, end in sorted((s, t) for _, _, s, t in kernels):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = sum(t - s for _, _, s, t in copies)
    assert total > 0, "no host<->device copies were recorded"
    on_compute = sum(t - s for _, stream, s, t in copies if stream in kernel_streams)
    covered = sum(max(0.0, min(t, k_end) - max(s, k_start)) for _, _, s, t in copies for k_start, k_end in merged)
    return on_compute / total, covered / total


def test_copies_run_on_a_side_stream_beside_the_compute():
    ids = _ids()
    on_compute, overlapped = _copy_placement(_device_events(_model("offload"), ids))
    stock_on_compute, stock_overlapped = _copy_placement(_device_events(_model("transformers"), ids))
    report(
        "offload overlap",
        slimrl_copy_time_on_compute_stream=on_compute,
        slimrl_copy_time_overlapped=overlapped,
        transformers_copy_time_on_compute_stream=stock_on_compute,
        transformers_copy_time_overlapped=stock_overlapped,
    )
    assert on_compute < 0.1 and overlapped > 0.0  # the copies ran on their own stream while kernels ran
    # negative control: transformers' save_on_cpu copies on the compute stream, so they cannot overlap kernels
    assert stock_on_compute > 0.9 and stock_overlapped < 0.05


def test_same_gradients_lower_peak_and_a_reused_pool():
    ids = _ids()
    plain_grads, plain_peak = _grads_and_peak(_model(True), ids)
    noise = max(rel_err(g, plain_grads[n]) for n, g in _grads_and_peak(_model(True), ids)[0].items())
    model = _model("offload")
    grads, peak = _grads_and_peak(model, ids)
    offloader = model_state(base_transformers_model(model)).offloader
    first = offloader.host_memory()
    for _ in range(2):
        _grads_and_peak(model, ids)
    stock_peak = _grads_and_peak(_model("transformers"), ids)[1]
    error = max(rel_err(grads[name], grad) for name, grad in plain_grads.items())
    report(
        "offload peak",
        plain_mib=plain_peak / 2**20,
        slimrl_offload_mib=peak / 2**20,
        transformers_offload_mib=stock_peak / 2**20,
        layer_input_mib=LAYER_INPUT / 2**20,
        host_pool_mib=first["bytes"] / 2**20,
        grad_error=error,
        plain_run_to_run=noise,
    )
    # the same bytes go into the same kernels: offload differs from plain no more than plain differs from itself
    assert error <= 2 * noise, (error, noise)
    stats = offloader.stats
    assert stats.tensors_moved == 3 * (LAYERS - 1) and stats.kept_last == 3 and stats.fetched_on_demand == 0
    # plain holds all LAYERS inputs at the backward's start, offload the kept one and the prefetched one
    assert peak <= plain_peak - (LAYERS - 3) * LAYER_INPUT, (peak, plain_peak)
    assert offloader.host_memory() == first and first["buffers"] == LAYERS - 1  # no allocation after the first step


def _seconds_per_step(mode) -> float:
    model, ids = _model(mode), _ids()
    for _ in range(2):  # warm-up: kernels chosen, host pool and allocator filled
        _step(model, ids)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
        _step(model, ids)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / TIMED_STEPS


def test_step_time_is_measured():
    """Reported, not asserted (speed targets live in bench/): plain checkpointing, slimrl's and transformers' offload,
    one after the other in one process on the same GPU."""
    seconds = {str(mode): _seconds_per_step(mode) for mode in (True, "offload", "transformers")}
    report(
        "offload step time",
        **seconds,
        slimrl_overhead=seconds["offload"] / seconds["True"] - 1,
        transformers_overhead=seconds["transformers"] / seconds["True"] - 1,
        rows=ROWS,
        seq=SEQ,
        width=WIDTH,
        layers=LAYERS,
    )
    assert all(value > 0 for value in seconds.values())
