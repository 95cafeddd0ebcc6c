"""Stock TRL vs slimrl on TRL 1.16's experimental online trainers (OnlineDPO, GMPO, A2PO): peak memory, a training
step's working memory, seconds per step, and each arm's losses.

    PYTHONPATH=src python bench/online_memory.py --vocab 152064 --completion 128 256 --threads 1 --markdown \
        --json bench/results/online_memory_cpu.json
    PYTHONPATH=src python bench/online_memory.py --quick                   # smoke run, tiny sizes

Choices:
* Each (trainer, completion length, arm) runs in its own process (this script re-invoked with `--child`), one after
  the other, never in parallel, with OMP/MKL threads pinned (`--threads`, default 1: the machine is shared). Arms
  differ only by `PatchFastRL(trainer)`: same config, seed, prompts and model weights, so equal losses show the same
  computation ran.
* Model: a random 4-layer, 256-wide Llama at `--vocab` (`slimrl.testing.tiny_llama`), LoRA r=16 on all projections,
  fp32 on CPU (`use_cpu=True, bf16=False`), TRL's default gradient checkpointing of each trainer's config. A random
  model rarely emits EOS, so completions run to the length limit (the worst case). 8 completions per step:
  OnlineDPO 4 prompts x 2 (reference: the adapter-disabled base), GMPO 1 prompt x 8 (beta 0: no reference),
  A2PO 8 prompts x 1 (reference: TRL's frozen copy of the PeftModel; Stage 1 with 2 samples per prompt runs before
  training and is not timed). Rewards: random, binary for A2PO.
* Memory (bench/_common.py, as bench/grpo_memory.py): "working" = peak RSS within `training_step` (rollouts,
  reference and policy scoring, loss, backward) minus RSS at its entry, max over steps; "peak" = peak RSS of the whole
  process (VmHWM polled every 5 ms). s/step is the mean over steps after the first (`--steps`, default 2).
  `--mem_limit_gb` (default 12): a child passing it is stopped and shown as "> LIMIT".
* CPU only (RSS). On a CUDA machine the same stock paths hold `[B, T, V]` logits too (OnlineDPO, A2PO), so the saving
  carries over; GMPO's stock path is TRL's fused head, chunked on CUDA already.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _arms as arms  # noqa: E402
from _common import GiB, render, write_results  # noqa: E402

TRAINERS = ("online_dpo", "gmpo", "a2po")
QUICK = {"vocab": 2048, "completion": [16]}
PROMPT = "what is the sum of 3 and 4 ? think step by step and answer"


def _config(trainer: str, completion: int, steps: int, output_dir: str):
    common = dict(
        output_dir=output_dir,
        max_steps=steps,
        learning_rate=1e-5,
        **arms.CPU_TRAINING_ARGS,
    )
    if trainer == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOConfig

        return OnlineDPOConfig(
            per_device_train_batch_size=4, max_new_tokens=completion, max_length=completion + 64, **common
        )
    if trainer == "gmpo":
        from trl.experimental.gmpo import GMPOConfig

        return GMPOConfig(per_device_train_batch_size=8, num_generations=8, max_completion_length=completion, **common)
    from trl.experimental.a2po import A2POConfig

    return A2POConfig(
        per_device_train_batch_size=8,
        max_completion_length=completion,
        num_value_samples=2,
        filter_all_incorrect=False,
        **common,
    )


def _trainer(trainer: str, model, tok, args, lora):
    import random

    from datasets import Dataset

    data = Dataset.from_dict({"prompt": [PROMPT] * (8 * args.max_steps)})
    if trainer == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOTrainer

        reward = lambda completions, **kw: [random.random() for _ in completions]  # noqa: E731
        return OnlineDPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, peft_config=lora
        )
    if trainer == "gmpo":
        from trl.experimental.gmpo import GMPOTrainer

        reward = lambda completions, **kw: [random.random() for _ in completions]  # noqa: E731
        return GMPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, peft_config=lora
        )
    from peft import get_peft_model
    from trl.experimental.a2po import A2POTrainer

    reward = lambda completions, **kw: [float(random.random() < 0.5) for _ in completions]  # noqa: E731
    trainer_obj = A2POTrainer(
        model=get_peft_model(model, lora), reward_funcs=reward, args=args, train_dataset=data, processing_class=tok
    )
    trainer_obj._estimate_optimal_values()  # Stage 1, before the measured steps
    return trainer_obj


def child(arm: str, trainer: str, vocab: int, completion: int, steps: int, mem_limit_gb: float) -> dict:
    record = {"arm": arm, "trainer": trainer, "vocab": vocab, "completion": completion}
    state = arms.start_child(arm, trainer, record, mem_limit_gb)
    import random
    import tempfile

    import torch

    from slimrl.testing import tiny_tokenizer

    random.seed(0)
    torch.manual_seed(0)
    tok = tiny_tokenizer(vocab)
    model = arms.bench_model(vocab)
    args = _config(trainer, completion, steps, tempfile.mkdtemp(prefix="slimrl-bench-"))
    trainer_obj = _trainer(trainer, model, tok, args, arms.bench_lora())
    return arms.train_measured(trainer_obj, record, state)


def _gib(r: dict, key: str) -> str:
    return f"> {r['limit'] / GiB:.1f} (stopped)" if r.get("stopped") else f"{r[key] / GiB:.2f}"


def _ratio(s: dict, m: dict, key: str) -> str:
    if "error" in s or "error" in m or m.get("stopped"):
        return "-"
    if s.get("stopped"):
        return f"<= {m[key] / s['limit']:.2f}"
    return f"{m[key] / s[key]:.2f}"


def table(rows: list[dict], markdown: bool) -> str:
    head = ["trainer", "vocab", "completion", "stock peak GiB", "slimrl peak GiB", "peak ratio", "stock working GiB"]
    head += ["slimrl working GiB", "working ratio", "stock s/step", "slimrl s/step", "max loss rel. diff"]
    lines = []
    for r in rows:
        s, m = r["stock"], r["slimrl"]
        if "error" in s or "error" in m:
            lines.append([r["trainer"], str(r["vocab"]), str(r["completion"])] + ["error"] * 9)
            continue
        stopped = s.get("stopped") or m.get("stopped")
        diff = "-" if stopped else max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(s["losses"], m["losses"]))
        lines.append(
            [r["trainer"], str(r["vocab"]), str(r["completion"]), _gib(s, "peak"), _gib(m, "peak")]
            + [_ratio(s, m, "peak"), _gib(s, "working"), _gib(m, "working"), _ratio(s, m, "working")]
            + [
                "-" if s.get("stopped") else f"{s['s_per_step']:.1f}",
                "-" if m.get("stopped") else f"{m['s_per_step']:.1f}",
            ]
            + [diff if isinstance(diff, str) else f"{diff:.1e}"]
        )
    return render(head, lines, markdown)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--completion", type=int, nargs="+", default=[128, 256])
    arms.add_arm_options(p, QUICK, mem_limit_gb=12.0)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.completion = QUICK["vocab"], QUICK["completion"]
    if a.child:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        return arms.run_child(
            a.threads, child, a.child, a.trainers[0], a.vocab, a.completion[0], a.steps, a.mem_limit_gb
        )

    rows = []
    for trainer in a.trainers:
        for completion in a.completion:
            row = {"trainer": trainer, "vocab": a.vocab, "completion": completion}
            child_args = ["--trainers", trainer, "--vocab", str(a.vocab), "--completion", str(completion)]
            child_args += ["--steps", str(a.steps), "--threads", str(a.threads), "--mem_limit_gb", str(a.mem_limit_gb)]
            rows.append(arms.run_arms(row, child_args, a.threads, f"{trainer} C={completion}"))
    print(
        f"# experimental online trainers, tiny Llama 4x256, LoRA r=16, 8 completions/step, CPU, {a.threads} thread(s)"
    )
    print(table(rows, a.markdown))
    if a.json:
        write_results(a.json, {"threads": a.threads, "steps": a.steps, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
