"""One LoRA linear layer, forward + backward on CPU: PEFT's eager forward, PEFT's with the input cast skipped, and
slimrl's fused function (slimrl.ops.fused_lora), at a few projection shapes.

    PYTHONPATH=src python bench/fused_lora_cpu.py --threads 1

Each case is a peft LoRA `Linear` (base frozen, r=16, B nonzero) called on [tokens, in] inputs, the output's
gradient a fixed random tensor; the three arms run interleaved, one timed forward + backward each per repetition,
after warm-up calls; the results file keeps every time, the median and the minimum (on a machine shared with other
jobs the minimum is the steadier figure). Two precisions: fp32 throughout, and a bf16
base with PEFT's fp32 adapters under bf16 autocast (the training set-up on a GPU; on a CPU without native bf16 GEMMs
its times say little about a GPU). The levers aim at a GPU, where the step is memory-bound; these CPU numbers only
show the fused function costs no time where it does not help.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, write_results  # noqa: E402

SHAPES = [  # (tokens, in, out): SmolLM2-135M's q_proj, up_proj, down_proj at 512 tokens; a wider square one
    (512, 576, 576),
    (512, 576, 1536),
    (512, 1536, 576),
    (1024, 1024, 1024),
]
RANK = 16
ARMS = ("peft", "peft_no_cast", "fused")


def layers(tokens: int, d_in: int, d_out: int, bf16: bool):
    """The three arms' models (PEFT, PEFT with the cast skipped, fused) over one set of weights, and the inputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch import nn

    from slimrl.models.lora_speed import speed_up_lora

    torch.manual_seed(0)
    model = get_peft_model(
        nn.Sequential(nn.Linear(d_in, d_out)), LoraConfig(r=RANK, lora_alpha=32, target_modules=["0"])
    )
    layer = model.base_model.model[0]
    nn.init.normal_(layer.lora_B["default"].weight, std=0.02)
    if bf16:
        layer.base_layer.to(torch.bfloat16)  # PEFT's adapters stay fp32 over a bf16 base
    arms = {
        "peft": model,
        "peft_no_cast": speed_up_lora(copy.deepcopy(model), fused=False),
        "fused": speed_up_lora(copy.deepcopy(model), fused=True, skip_input_casts=False),
    }
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(tokens, d_in).to(dtype)
    upstream = torch.randn(tokens, d_out).to(dtype)
    return arms, x, upstream


def step(model, x, upstream, bf16: bool) -> float:
    """Seconds of one forward + backward."""
    import torch

    x = x.detach().requires_grad_(True)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = model(x)
    y.backward(upstream)
    return time.perf_counter() - start


def measure(shape, bf16: bool, repeats: int, warmup: int) -> list[dict]:
    arms, x, upstream = layers(*shape, bf16)
    times = {arm: [] for arm in ARMS}
    for rep in range(warmup + repeats):
        for arm in ARMS:
            arms[arm].zero_grad(set_to_none=True)
            seconds = step(arms[arm], x, upstream, bf16)
            if rep >= warmup:
                times[arm].append(round(seconds * 1e3, 4))
    precision = "bf16-autocast" if bf16 else "fp32"
    return [
        {"tokens": shape[0], "in": shape[1], "out": shape[2], "r": RANK, "precision": precision, "arm": arm}
        | {"median_ms": statistics.median(times[arm]), "min_ms": min(times[arm]), "times_ms": times[arm]}
        for arm in ARMS
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=results_path("fused_lora_cpu"))
    args = parser.parse_args()
    pin_threads(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print(
        f"{'tokens x in -> out':>22} {'precision':>14} "
        + " ".join(f"{a + ' ms':>16}" for a in ARMS)
        + "  fused/peft (median, min)"
    )
    for shape in SHAPES:
        for bf16 in (False, True):
            found = measure(shape, bf16, args.repeats, args.warmup)
            rows += found
            medians, minima = [r["median_ms"] for r in found], [r["min_ms"] for r in found]
            label = f"{shape[0]} x {shape[1]} -> {shape[2]}"
            cells = " ".join(f"{m:>16.2f}" for m in medians)
            ratios = f"{medians[2] / medians[0]:.2f}, {minima[2] / minima[0]:.2f}"
            print(f"{label:>22} {found[0]['precision']:>14} {cells}  {ratios:>10}")
    write_results(args.out, {"threads": args.threads, "repeats": args.repeats, "warmup": args.warmup, "rows": rows})
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
