"""Stock TRL vs slimrl on the same GRPO run: peak memory, policy forward+backward working memory, seconds per step.

    PYTHONPATH=src python bench/grpo_memory.py --vocab 152064 --completion 256 512 --steps 2 --threads 1
    PYTHONPATH=src python bench/grpo_memory.py --quick --markdown
    PYTHONPATH=src python bench/grpo_memory.py --kernel --vocab 152064      # the log-prob op alone

Choices:
* Each (arm, config) runs in its own process (this script re-invoked with `--child`), one after the other, never in
  parallel, with OMP/MKL threads pinned (`--threads`, default: all cores; use 1 on a shared machine).
* Model: a random 4-layer, 256-wide Llama at the given vocabulary, LoRA r=16 on all projections, G=8 completions of
  one prompt per step (batch 8), fp32 on CPU (`use_cpu=True, bf16=False`); a random model never emits EOS, so every
  completion runs to `max_completion_length` (the worst case). Rewards are random.
* "working" = peak minus RSS just before the policy forward (`compute_loss` entry) up to the end of its backward
  (`accelerator.backward`), max over steps: what the log-prob path costs. "peak" = peak RSS of the whole process
  (VmHWM polled every 5 ms, folded before every reset).
  On CUDA both read torch's allocator peaks instead. s/step is the mean over steps after the first.
* `--control-buffer`: each arm also holds a written [completion, vocab] fp32 buffer from the policy forward to the
  end of its backward (the negative control of bench/grpo_memory_guard.py: a regression it must catch).
* slimrl arm: `PatchFastRL("grpo")` when `slimrl.patches.registry` provides it, else slimrl's `add_fused_lm_head`
  assigned over `trl.trainer.grpo_trainer.add_fused_lm_head` (the same seam PatchFastRL uses).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    GiB,
    OverallPeak,
    PhasePeak,
    pin_threads,
    results_path,
    run_self,
    step_timer,
    write_results,
)

MiB = 1024**2


def enable_slimrl() -> str:
    """Switch TRL's GRPO/RLOO fused head to slimrl's; returns how."""
    try:
        from slimrl.patches.registry import PatchFastRL
    except ImportError:
        PatchFastRL = None
    if PatchFastRL is not None:
        PatchFastRL("grpo")
        return "PatchFastRL"
    import trl.trainer.grpo_trainer as grpo_mod
    import trl.trainer.rloo_trainer as rloo_mod

    from slimrl.ops.logprob import add_fused_lm_head

    grpo_mod.add_fused_lm_head = rloo_mod.add_fused_lm_head = add_fused_lm_head
    return "add_fused_lm_head"


def child_grpo(arm: str, vocab: int, completion: int, steps: int, device: str, control_buffer: bool = False) -> dict:
    import random
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig

    how = enable_slimrl() if arm == "slimrl" else "stock"
    from trl import GRPOConfig, GRPOTrainer

    from slimrl.testing import tiny_llama, tiny_tokenizer

    cuda = device == "cuda"
    tok = tiny_tokenizer(vocab)
    model = tiny_llama(
        vocab_size=vocab, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, max_position_embeddings=4096
    )
    data = Dataset.from_dict({"prompt": ["what is the sum of 3 and 4 ? think step by step and answer"] * 64})
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=completion,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        learning_rate=1e-5,
        use_cpu=not cuda,
        bf16=cuda,
        seed=0,
    )
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [random.random() for _ in completions],
        args=args,
        train_dataset=data,
        processing_class=tok,
        peft_config=lora,
    )

    overall = None if cuda else OverallPeak()
    phase, working, cuda_peak, held = PhasePeak(overall), [], [0], []
    compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward

    def measured_compute_loss(*a, **kw):
        if cuda:
            torch.cuda.synchronize()
            phase.base = torch.cuda.memory_allocated()
            cuda_peak[0] = max(cuda_peak[0], torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        else:
            phase.start()
        if control_buffer:  # the negative control of bench/grpo_memory_guard.py: an extra [T, V] fp32 buffer, written
            held.append(torch.ones(completion, vocab, device=trainer.accelerator.device))
        return compute_loss(*a, **kw)

    def measured_backward(*a, **kw):
        out = backward(*a, **kw)
        if cuda:
            torch.cuda.synchronize()
            working.append(torch.cuda.max_memory_allocated() - phase.base)
        else:
            base, peak = phase.stop()
            working.append(peak - base)
        held.clear()
        return out

    trainer.compute_loss, trainer.accelerator.backward = measured_compute_loss, measured_backward

    timer = step_timer()
    trainer.add_callback(timer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    step_times = timer.times
    timed = step_times[1:] or step_times
    peak = max(cuda_peak[0], torch.cuda.max_memory_allocated()) if cuda else overall.stop()
    return {
        "arm": arm,
        "how": how,
        "vocab": vocab,
        "completion": completion,
        "steps": len(step_times),
        "peak": peak,
        "working": max(working),
        "working_steps": working,
        "control_buffer": control_buffer,
        "s_per_step": sum(timed) / len(timed),
        "device": device,
        "grad_bytes": sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad),
    }


def child_kernel(variant: str, vocab: int, completion: int, device: str, reps: int) -> dict:
    """The log-prob op alone on a GRPO-shaped micro-batch: 8 rows of (prompt 16 + completion) tokens, H=256."""
    import torch

    from slimrl.ops.logprob import fused_logprobs

    torch.manual_seed(0)
    rows, prompt, H = 8, 16, 256
    T = prompt + completion - 1
    hidden = torch.randn(rows, T, H, device=device, requires_grad=True)
    weight = torch.randn(vocab, H, device=device) * 0.02
    labels = torch.randint(0, vocab, (rows, T), device=device)
    labels[:, : prompt - 1] = -100
    outputs = ("log_probs", "entropy")
    phase = PhasePeak()

    def step():
        mask = labels != -100
        if variant == "trl-stock":  # what stock TRL 1.16 runs on CPU: every position, 4096x32768 tiles
            from trl.kernels.chunked_logprob import ChunkedLogProbFunction

            lp, ent, *_ = ChunkedLogProbFunction.apply(
                hidden.reshape(-1, H), weight, None, labels.clamp(min=0).reshape(-1), 1.0, 32768, None, 1.0, outputs
            )
            lp, ent = lp.view(mask.shape).masked_fill(~mask, 0), ent.view(mask.shape).masked_fill(~mask, 0)
        elif variant == "trl-compact":  # TRL's kernel, completion tokens only
            from trl.kernels.chunked_logprob import ChunkedLogProbFunction

            lp, ent, *_ = ChunkedLogProbFunction.apply(
                hidden[mask], weight, None, labels[mask], 1.0, 32768, None, 1.0, outputs
            )
        else:  # slimrl-auto / slimrl-<N>
            chunks = -1 if variant == "slimrl-auto" else int(variant.split("-")[1])
            lp, ent, *_ = fused_logprobs(
                hidden[mask], weight, None, labels[mask], 1.0, None, 1.0, outputs, num_chunks=chunks
            )
        lp.sum().backward()  # entropy logged only, as in GRPO's default loss
        return ent

    step()  # warm-up
    hidden.grad = None
    times, peaks = [], []
    for _ in range(reps):
        phase.start()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        base, peak = phase.stop()
        peaks.append(peak - base)
        hidden.grad = None
    return {"variant": variant, "vocab": vocab, "completion": completion, "working": max(peaks), "s": min(times)}


def _fmt_table(rows: list[dict], markdown: bool) -> str:
    head = [
        "vocab",
        "completion",
        "stock peak GiB",
        "slimrl peak GiB",
        "peak ratio",
        "stock working GiB",
        "slimrl working GiB",
        "working ratio",
        "stock s/step",
        "slimrl s/step",
        "time ratio",
    ]
    lines = []
    for r in rows:
        s, m = r["stock"], r["slimrl"]
        if "error" in s or "error" in m:
            lines.append([str(r["vocab"]), str(r["completion"])] + ["error"] * 9)
            continue
        lines.append(
            [
                str(r["vocab"]),
                str(r["completion"]),
                f"{s['peak'] / GiB:.2f}",
                f"{m['peak'] / GiB:.2f}",
                f"{m['peak'] / s['peak']:.2f}",
                f"{s['working'] / GiB:.3f}",
                f"{m['working'] / GiB:.3f}",
                f"{m['working'] / max(s['working'], 1):.2f}",
                f"{s['s_per_step']:.1f}",
                f"{m['s_per_step']:.1f}",
                f"{m['s_per_step'] / s['s_per_step']:.2f}",
            ]
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 152064])
    p.add_argument("--completion", type=int, nargs="+", default=[64, 256, 512, 1024])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP/MKL threads per process (1 if shared)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    p.add_argument("--quick", action="store_true", help="V=32k C=64 and V=152k C=256, 2 steps")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--kernel", action="store_true", help="benchmark the log-prob op alone (TRL vs slimrl)")
    p.add_argument("--variants", nargs="+", default=["trl-stock", "trl-compact", "slimrl-auto", "slimrl-8"])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", default=results_path("grpo_memory"), help="the results file")
    p.add_argument("--control-buffer", action="store_true", help="hold an extra [completion, vocab] buffer (a control)")
    p.add_argument("--child", choices=["stock", "slimrl", "kernel"], help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        pin_threads(a.threads)
        if a.child == "kernel":
            res = child_kernel(a.variant, a.vocab[0], a.completion[0], a.device, a.reps)
        else:
            res = child_grpo(a.child, a.vocab[0], a.completion[0], a.steps, a.device, a.control_buffer)
        print(json.dumps(res), flush=True)
        return 0

    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.quick:
        configs = [(32768, 64), (152064, 256)]
    else:
        configs = [(v, c) for v in a.vocab for c in a.completion]
    common = ["--threads", str(a.threads), "--device", a.device, *(["--control-buffer"] if a.control_buffer else [])]

    if a.kernel:
        kernel_rows = []
        print(f"# log-prob op alone: 8 rows x (16 + C) tokens, H=256, fp32, fwd+bwd, {a.threads} thread(s)")
        print(f"{'vocab':>7} {'C':>5} {'variant':>12} {'working MiB':>12} {'s':>7}")
        for vocab, completion in configs:
            for variant in a.variants:
                r = run_self(
                    [
                        "--child",
                        "kernel",
                        "--variant",
                        variant,
                        "--vocab",
                        str(vocab),
                        "--completion",
                        str(completion),
                        "--reps",
                        str(a.reps),
                        *common,
                    ],
                    a.threads,
                )
                kernel_rows.append({"vocab": vocab, "completion": completion, "variant": variant, **r})
                if "error" in r:
                    print(f"{vocab:>7} {completion:>5} {variant:>12} {r['error']}")
                    continue
                print(
                    f"{vocab:>7} {completion:>5} {variant:>12} {r['working'] / MiB:>12.0f} {r['s']:>7.2f}", flush=True
                )
        write_results(a.json, kernel_rows)
        return 0

    rows = []
    for vocab, completion in configs:
        row = {"vocab": vocab, "completion": completion}
        for arm in ("stock", "slimrl"):
            row[arm] = run_self(
                [
                    "--child",
                    arm,
                    "--vocab",
                    str(vocab),
                    "--completion",
                    str(completion),
                    "--steps",
                    str(a.steps),
                    *common,
                ],
                a.threads,
            )
            if "error" in row[arm]:
                print(f"[{arm} V={vocab} C={completion}] {row[arm]['error']}", file=sys.stderr)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"# GRPO, tiny Llama 4x256, LoRA r=16, G=8, {a.steps} steps, {a.device}, {a.threads} thread(s)")
    print(_fmt_table(rows, a.markdown))
    write_results(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
