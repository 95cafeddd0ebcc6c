"""The measurements behind the shared-prefix design: the mechanism, and the "auto" rule.

    PYTHONPATH=src python bench/shared_prefix_ops.py --mechanisms --threads 1
    PYTHONPATH=src python bench/shared_prefix_ops.py --sweep --threads 1

`--mechanisms`: forward+backward of one batch of G=8 completions of one prompt through the fused log-prob head, three
ways, each in its own process (peak RSS above the process's resident set before the first run): TRL's per-row
forward; the packed rows of slimrl.ops.shared_prefix (the chosen mechanism); and the prompt's keys/values computed once
and gathered to the rows as a `DynamicCache`, the completions forwarded with it (the rejected alternative; it cannot
run under gradient checkpointing, which drops `past_key_values`). Shapes: a 4 x 256 Llama (V=32k) at prompt 512 /
completion 128, and SmolLM2-135M's shape (30 x 576, V=49152) at prompt 150 / completion 16.

`--sweep`: for prompt / completion lengths and prompts per batch, the estimate of `estimated_cost_ratio` next to the
measured packed / per-row time (min of 3, interleaved in one process), on a 4 x 256 and a 4 x 576 model.

`--small`: the same ratio on tiny forwards (the parity suites' 2 x 32 model and up), next to the per-row forward's
FLOPs (`forward_flops`): where packing's own cost (~1 ms) eats the saving, the basis of `AUTO_MIN_FLOPS`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PhasePeak, pin_threads, results_path, run_self, write_results  # noqa: E402

MiB = 1024**2
SHAPES = {  # name: (tiny_llama kwargs, prompt, completion)
    "4x256": (
        dict(vocab_size=32000, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=688),
        512,
        128,
    ),
    "smollm2": (
        dict(
            vocab_size=49152,
            hidden_size=576,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            intermediate_size=1536,
            tie_word_embeddings=True,
        ),
        150,
        16,
    ),
    "4x576": (
        dict(
            vocab_size=49152,
            hidden_size=576,
            num_layers=4,
            num_heads=9,
            num_kv_heads=3,
            intermediate_size=1536,
            tie_word_embeddings=True,
        ),
        None,
        None,
    ),
    "2x32": (dict(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2), 8, 7),
    "2x64": (dict(vocab_size=1024, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2), 24, 8),
    "4x128": (dict(vocab_size=4096, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2), 64, 16),
}
SWEEP = [(150, 16, 2), (512, 128, 1), (64, 128, 1), (32, 64, 4), (16, 256, 1), (16, 512, 1)]


def model_for(shape: str):
    import torch

    from slimrl.ops.logprob import add_fused_lm_head
    from slimrl.testing import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama(max_position_embeddings=8192, **SHAPES[shape][0])
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def batch(prompt: int, completion: int, prompts: int, rows: int = 8, vocab: int = 1000):
    """`rows` completions of `prompts` prompts (10% left padding), interleaved as TRL's shuffle leaves them, ragged."""
    import torch

    g = torch.Generator().manual_seed(0)
    texts = torch.randint(3, vocab, (prompts, prompt), generator=g)
    prompt_mask = torch.ones_like(texts)
    prompt_mask[:, : prompt // 10] = 0
    which = torch.arange(rows) % prompts
    ids = torch.cat([texts[which], torch.randint(3, vocab, (rows, completion), generator=g)], 1)
    mask = torch.cat([prompt_mask[which], torch.ones(rows, completion, dtype=torch.long)], 1)
    for r in range(rows):
        mask[r, prompt + completion - (r * completion) // 16 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :prompt] = -100
    return ids.masked_fill(mask == 0, 0), mask, labels, completion


def per_row(model, ids, mask, labels, C):
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -C:], out.entropy[:, -C:]


def packed(model, ids, mask, labels, C):
    import torch

    from slimrl.ops import shared_prefix as op

    pk = op.pack(ids, mask, labels)
    out = model(
        input_ids=pk.input_ids,
        attention_mask=op.attention_mask_4d(pk, "sdpa", torch.float32),
        position_ids=pk.position_ids,
        shift_labels=pk.shift_labels,
        fused_lm_head=True,
    )
    return op.unpack(out.log_probs, pk)[:, -C:], op.unpack(out.entropy, pk)[:, -C:]


def kv_cache(model, ids, mask, labels, C):
    """The rejected alternative: prompt forwarded once with a cache, its keys/values gathered to the rows."""
    import torch
    from transformers import DynamicCache

    from slimrl.ops import shared_prefix as op
    from slimrl.ops.logprob import fused_logprobs

    T = ids.shape[1]
    P = T - C
    groups = op.prompt_groups(ids, mask, labels)
    inverse = torch.empty(ids.shape[0], dtype=torch.long)
    for u, group in enumerate(groups):
        inverse[group] = u
    firsts = [g[0] for g in groups]
    prompt_out = model.model(input_ids=ids[firsts, :P], attention_mask=mask[firsts, :P], use_cache=True)
    cache = DynamicCache()
    for i, layer in enumerate(prompt_out.past_key_values.layers):
        cache.update(layer.keys[inverse], layer.values[inverse], i)
    positions = torch.arange(P, T)[None].expand(ids.shape[0], -1)
    out = model.model(
        input_ids=ids[:, P:], attention_mask=mask, past_key_values=cache, position_ids=positions, use_cache=True
    )
    hidden = torch.cat([prompt_out.last_hidden_state[inverse, -1:], out.last_hidden_state[:, :-1]], 1)
    target = labels[:, P:]
    scored = target != -100
    lp, ent, *_ = fused_logprobs(
        hidden[scored], model.lm_head.weight, None, target[scored], 1.0, None, 1.0, ("log_probs", "entropy")
    )
    zeros = torch.zeros(scored.shape)
    return zeros.masked_scatter(scored, lp), zeros.masked_scatter(scored, ent)


ARMS = {"per-row": per_row, "packed": packed, "kv-cache": kv_cache}


def step(model, fn, data) -> float:
    t0 = time.perf_counter()
    logps, entropies = fn(model, *data)
    (logps.sum() + 0.01 * entropies.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def child_mechanism(shape: str, arm: str, reps: int) -> dict:
    model = model_for(shape)
    data = batch(SHAPES[shape][1], SHAPES[shape][2], 1)
    phase = PhasePeak()
    base = phase.start()
    times = [step(model, ARMS[arm], data) for _ in range(reps)]
    _, peak = phase.stop()
    return {"shape": shape, "arm": arm, "s": min(times), "peak_above_start": peak - base}


def sweep(shape: str) -> None:
    from slimrl.ops import shared_prefix as op
    from slimrl.patches.setup.shared_prefix_rules import estimated_cost_ratio

    model = model_for(shape)
    for prompt, completion, prompts in SWEEP:
        data = batch(prompt, completion, prompts)
        pk = op.pack(*data[:3])
        estimate = estimated_cost_ratio(model.config, *data[0].shape, *pk.input_ids.shape)
        times = {"per-row": [], "packed": []}
        for _ in range(3):
            for arm, measured in times.items():
                measured.append(step(model, ARMS[arm], data))
        ratio = min(times["packed"]) / min(times["per-row"])
        print(f"| {shape} | {prompt} | {completion} | {prompts} | {estimate:.2f} | {ratio:.2f} |", flush=True)


def small() -> None:
    from slimrl.patches.setup.shared_prefix_rules import forward_flops

    for shape, rows, prompts in (("2x32", 4, 2), ("2x64", 8, 2), ("4x128", 8, 1)):
        model = model_for(shape)
        data = batch(SHAPES[shape][1], SHAPES[shape][2], prompts, rows, vocab=min(1000, model.config.vocab_size))
        times = {"per-row": [], "packed": []}
        for _ in range(5):
            for arm, measured in times.items():
                measured.append(step(model, ARMS[arm], data))
        flops = forward_flops(model.config, *data[0].shape)
        print(
            f"| {shape} | {rows} x {data[0].shape[1]} | {flops:.1e} | {1000 * min(times['per-row']):.1f} | "
            f"{1000 * min(times['packed']):.1f} | {min(times['packed']) / min(times['per-row']):.2f} |",
            flush=True,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mechanisms", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--small", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=results_path("shared_prefix_ops"), help="the results file (the printed tables)")
    p.add_argument("--child", nargs=2, metavar=("SHAPE", "ARM"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        pin_threads(a.threads)
        print(json.dumps(child_mechanism(*a.child, a.reps)), flush=True)
        return 0
    if a.mechanisms:
        print("| shape | arm | s (fwd+bwd) | peak MiB above start |\n|---|---|---|---|")
        for shape in ("4x256", "smollm2"):
            for arm in ARMS:
                r = run_self(["--child", shape, arm, "--threads", str(a.threads), "--reps", str(a.reps)], a.threads)
                cells = (
                    ["error", r["error"][-200:]]
                    if "error" in r
                    else [f"{r['s']:.2f}", f"{r['peak_above_start'] / MiB:.0f}"]
                )
                print(f"| {shape} | {arm} | {' | '.join(cells)} |", flush=True)
    if a.sweep:
        pin_threads(a.threads)
        print("| model | prompt | completion | prompts per batch | estimate | measured |\n|---|---|---|---|---|---|")
        for shape in ("4x256", "4x576"):
            sweep(shape)
    if a.small:
        pin_threads(a.threads)
        print("| model | rows x length | per-row FLOPs | per-row ms | packed ms | ratio |\n|---|---|---|---|---|---|")
        small()
    write_results(a.json, {"args": {k: v for k, v in vars(a).items() if k != "child"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
