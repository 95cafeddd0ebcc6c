"""One profiled training step for bench/gpu_memory.py (`--profile ARM ...`): torch.profiler over the arm's last step
(an extra step after the timed ones, left out of s/step), its time split by category from the kernels' names.

* CUDA: the self time of every kernel and memcpy/memset on the device (`device_type` CUDA); the CPU ops that launched
  them are left out, so nothing is counted twice. CPU (the smoke run): the self CPU time of every operator.
* Categories (`categorize`, first matching rule wins; names lower-cased): attention (flash, fmha, cuDNN SDPA, ...)
  before GEMM (cutlass attention kernels hold "cutlass" too); GEMM (cuBLAS, cutlass, nvjet, xmma, aten::mm/addmm/
  bmm); norm (RMSNorm / LayerNorm kernels, Liger's and Unsloth's included; an eager RMSNorm is pow/mean/rsqrt/mul
  kernels, counted as elementwise); rope (rotary kernels; an eager RoPE is elementwise too); elementwise/cast
  (pointwise and reduction kernels, Triton fused kernels, dtype casts: `direct_copy_kernel` and CPU's
  `aten::copy_` are both casts and same-dtype contiguous copies); copy (memcpy, memset, cat, index/gather/scatter);
  other (the rest: softmax, cross-entropy, the optimizer's foreach kernels, ...).
* The row's `profile`: milliseconds and shares per category and the 15 longest names; bench/gpu_memory.py moves it to
  the results file's `profiles`, next to the rows. Runs in every arm's environment (Unsloth's too): no slimrl import.
"""

from __future__ import annotations

import re

CATEGORIES = ("attention", "gemm", "norm", "rope", "elementwise/cast", "copy", "other")
RULES = (
    ("attention", r"flash|fmha|attention|sdpa|_attn|mha_"),
    ("gemm", r"gemm|cutlass|cublas|nvjet|xmma|aten::(mm|addmm_?|bmm|matmul|linear)$"),
    ("norm", r"rms_?norm|layer_?norm|group_?norm|batch_?norm"),
    ("rope", r"rope|rotary"),
    ("copy", r"memcpy|memset|catarray|aten::(cat|index\w*|gather|scatter\w*)$|index_?select|gather|scatter"),
    (
        "elementwise/cast",
        r"elementwise|reduce_kernel|direct_copy|triton_(poi|red|per)_|silu|swiglu|geglu|aten::(_to_copy|to|mul|add|"
        r"sub|div|pow|mean|sum|rsqrt|neg|silu|exp|where|fill_|zero_|clamp|add_|mul_|copy_)$|_to_copy|cast",
    ),
)
_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in RULES)
TOP = 15


def categorize(name: str) -> str:
    """The category of a kernel or operator name (module docstring)."""
    lowered = name.lower()
    return next((category for category, pattern in _COMPILED if pattern.search(lowered)), "other")


def _device_time(event) -> float:
    for attribute in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, attribute, None)
        if value is not None:
            return float(value)
    return 0.0


def summarize(events, cuda: bool) -> dict:
    """Milliseconds and shares per category from `prof.key_averages()` (or objects with the same attributes)."""
    totals, named = dict.fromkeys(CATEGORIES, 0.0), {}
    for event in events:
        if cuda:
            if not str(getattr(event, "device_type", "")).endswith("CUDA"):
                continue
            micros = _device_time(event)
        else:
            micros = float(event.self_cpu_time_total)
        if micros <= 0:
            continue
        totals[categorize(event.key)] += micros / 1000
        named[event.key] = named.get(event.key, 0.0) + micros / 1000
    total = sum(totals.values())
    top = sorted(named.items(), key=lambda item: -item[1])[:TOP]
    return {
        "clock": "device kernels" if cuda else "cpu operators (self time)",
        "total_ms": total,
        "ms": totals,
        "share": {k: (v / total if total else 0.0) for k, v in totals.items()},
        "top": [[name, ms, categorize(name)] for name, ms in top],
    }


def profile_callback(step: int, cuda: bool):
    """A TrainerCallback profiling optimizer step number `step` (0-based); its summary lands in `.result`."""
    import torch
    from transformers import TrainerCallback

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    class StepProfiler(TrainerCallback):
        def __init__(self):
            self.result, self.prof = None, None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == step:
                self.prof = torch.profiler.profile(activities=activities)
                self.prof.__enter__()

        def on_step_end(self, args, state, control, **kw):
            if self.prof is not None and self.result is None:
                if cuda:
                    torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                self.result = dict(summarize(self.prof.key_averages(), cuda), step=step)
                self.prof = None

    return StepProfiler()
