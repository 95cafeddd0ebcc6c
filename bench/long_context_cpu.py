"""The working memory of one long GRPO step on a CPU, lever by lever: stock TRL, slimrl without its long-context
levers, + row groups, + tiled MLP, + padding-free scoring (and slimrl's defaults).

    PYTHONPATH=src python bench/long_context_cpu.py --threads 1 --json bench/results/long_context_cpu.json
    PYTHONPATH=src python bench/long_context_cpu.py --quick          # 8 x 256 tokens, 4 layers: a smoke run

Choices:
* Model: SmolLM2-135M's shapes (30 layers, hidden 576, 9 / 3 heads, intermediate 1536, vocabulary 49152, tied
  embeddings), random weights, fp32 on CPU (`use_cpu=True, bf16=False`), LoRA r=16 on every projection, TRL's
  defaults otherwise (gradient checkpointing on, loss "dapo", beta 0, one iteration: the step is the policy forward
  and backward).
* Rows: one step of 8 rows (one prompt x 8 completions), a 128-token prompt and completions of uneven lengths
  spread evenly from 960 to 1920 tokens, so TRL pads every row to 2048 (23% of the positions are padding). They come
  from TRL's own `rollout_func` hook (fixed token ids, no sampling): generation is not what is measured, and every
  arm trains on the same rows. Rewards are fixed and spread, so advantages are not zero.
* Each arm runs in its own process (this script re-invoked with `--child`), one after the other, threads pinned.
  "working" = peak RSS during `training_step` (the kernel's high-water mark, bench/_common.PhasePeak) minus the RSS
  when it started; "peak" = the process's peak RSS over the whole run (bench/_common.OverallPeak), read the same way
  in every arm. s/step is one step's wall time (noisy on a shared machine; compare within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import GiB, OverallPeak, PhasePeak, pin_threads, render, run_self, write_results  # noqa: E402

ARMS = {  # name -> slimrl config fields (None: stock TRL)
    "stock": None,
    "slimrl": dict(slimrl_rows_per_group=False, slimrl_tiled_mlp=False, slimrl_padding_free=False),
    "+ row groups": dict(slimrl_rows_per_group="auto", slimrl_tiled_mlp=False, slimrl_padding_free=False),
    "+ tiled MLP": dict(slimrl_rows_per_group="auto", slimrl_tiled_mlp=True, slimrl_padding_free=False),
    "+ padding-free": dict(slimrl_rows_per_group="auto", slimrl_tiled_mlp=True, slimrl_padding_free="auto"),
    "slimrl defaults": {},
}
SMOLLM2 = dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536, vocab_size=49152)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def completion_lengths(rows: int, shortest: int, longest: int) -> list[int]:
    return [round(shortest + (longest - shortest) * i / max(rows - 1, 1)) for i in range(rows)]


def fixed_rollouts(prompt_tokens: int, lengths: list[int], vocab: int):
    """A `rollout_func` returning the same prompt and completions every call (ids avoid the special tokens)."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, vocab, (prompt_tokens,), generator=g).tolist()
    completions = [torch.randint(100, vocab, (n,), generator=g).tolist() for n in lengths]

    def rollout(prompts, trainer):
        per_prompt = len(completions) // len(prompts)
        return {
            "prompt_ids": [prompt for _ in prompts for _ in range(per_prompt)],
            "completion_ids": completions[: len(prompts) * per_prompt],
            "logprobs": None,
        }

    return rollout


def child(arm: str, layers: int, prompt_tokens: int, lengths: list[int]) -> dict:
    import tempfile

    from datasets import Dataset
    from peft import LoraConfig

    fields = ARMS[arm]
    if fields is not None:
        from slimrl import PatchFastRL

        PatchFastRL("grpo")
    from trl import GRPOConfig, GRPOTrainer

    from slimrl.testing import tiny_llama, tiny_tokenizer

    shapes = dict(SMOLLM2, num_layers=layers)
    model = tiny_llama(seed=0, tie_word_embeddings=True, max_position_embeddings=8192, **shapes)
    rows = len(lengths)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        per_device_train_batch_size=rows,
        num_generations=rows,
        max_completion_length=max(lengths),
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        **(fields or {}),
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(i % 3) for i in range(len(completions))],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a long question"] * 16}),
        processing_class=tiny_tokenizer(shapes["vocab_size"]),
        peft_config=lora,
        rollout_func=fixed_rollouts(prompt_tokens, lengths, shapes["vocab_size"]),
    )
    overall, steps = OverallPeak(), []
    step = trainer.training_step

    def measured_step(*a, **kw):
        phase_peak = PhasePeak(overall)
        base = phase_peak.start()
        t0 = time.perf_counter()
        out = step(*a, **kw)
        seconds = time.perf_counter() - t0
        _, peak = phase_peak.stop()
        steps.append({"working": peak - base, "base": base, "seconds": seconds})
        return out

    trainer.training_step = measured_step
    trainer.train()
    record = {"arm": arm, "fields": fields, "steps": steps, "peak": overall.stop(), "working": steps[-1]["working"]}
    if fields is not None:
        from slimrl.models.tiled_mlp import tiled_mlp_state
        from slimrl.patches.scoring.padding_free import padding_free_stats
        from slimrl.patches.scoring.row_groups import row_group_stats
        from slimrl.patches.scoring.shared_prefix import shared_prefix_stats

        state = tiled_mlp_state(trainer.model)
        record["row_groups"] = vars(row_group_stats(trainer)) | {"reasons": dict(row_group_stats(trainer).reasons)}
        record["padding_free"] = vars(padding_free_stats(trainer))
        record["tiled_mlp_calls"] = None if state is None else state.tiled_calls
        shared = shared_prefix_stats(trainer)
        record["shared_prefix"] = vars(shared) | {"reasons": dict(shared.reasons)}
    return record


def machine() -> dict:
    import torch
    import transformers
    import trl

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True).stdout)
    import peft

    return {
        "commit": commit + ("+dirty" if dirty else ""),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def table(results: list[dict], markdown: bool) -> str:
    stock = next((r for r in results if r.get("arm") == "stock" and "error" not in r), None)
    lines = []
    for r in results:
        if "error" in r:
            lines.append([r["arm"], "error", "", "", "", ""])
            continue
        ratio = f"{r['working'] / stock['working']:.2f}" if stock else ""
        seconds = r["steps"][-1]["seconds"]
        lines.append([r["arm"], f"{r['working'] / GiB:.2f}", ratio, f"{r['peak'] / GiB:.2f}", f"{seconds:.0f}", ""])
    head = ["arm", "working GiB", "x stock", "peak GiB", "s/step", ""]
    return render(head[:-1], [line[:-1] for line in lines], markdown)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP/MKL threads per process (1 if shared)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--layers", type=int, default=SMOLLM2["num_layers"])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--completion", type=int, nargs=2, default=[960, 1920], metavar=("SHORTEST", "LONGEST"))
    p.add_argument("--quick", action="store_true", help="4 layers, completions of 64-128 tokens")
    p.add_argument("--json", help="write the results and the machine here")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.prompt, a.completion = 4, 64, [64, 128]
    lengths = completion_lengths(a.rows, *a.completion)
    if a.child:
        pin_threads(a.threads)
        print(json.dumps(child(a.child, a.layers, a.prompt, lengths)), flush=True)
        return 0
    common = ["--threads", str(a.threads), "--layers", str(a.layers), "--rows", str(a.rows), "--prompt", str(a.prompt)]
    common += ["--completion", *map(str, a.completion)]
    measured_on = machine()  # before the arms run: the commit the children import
    results = []
    for arm in a.arms:
        results.append(run_self(["--child", arm, *common], a.threads) | {"arm": arm})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    setup = dict(layers=a.layers, rows=a.rows, prompt=a.prompt, completion_lengths=lengths, threads=a.threads)
    print(f"# GRPO step, SmolLM2-135M shapes ({a.layers} layers), LoRA r=16, fp32, {setup}")
    print(table(results, a.markdown))
    if a.json:
        write_results(a.json, {"setup": setup, "machine": measured_on, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
