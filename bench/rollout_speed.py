"""Rollout speed: HF generate vs slimrl's vLLM engine (tokens/s), and GRPO seconds per step with each backend.

Usage (needs vLLM: `bash scripts/install_vllm.sh`, then run with its python):
    .venv-vllm/bin/python bench/rollout_speed.py [--batches 8 64] [--completion 256] [--grpo_steps 5]
        [--grpo_completion 128] [--threads 2] [--eager] [--quick] [--markdown] [--json FILE]

Every arm runs alone in its own process on the embedded SmolLM2-135M-Instruct in its default dtype (bf16 on a CPU
with AMX/AVX512-BF16), sampling at temperature 1 with the length forced (HF `min_new_tokens`, vLLM `ignore_eos`), so
both sides decode exactly batch × completion tokens. Arms:
  hf          transformers generate as TRL calls it (batched, dynamic KV cache), without and with a LoRA
              adapter (r=16, random B); hf-static / hf-compile: the same with a static cache / + torch.compile
              (not in the default --arms; they decide whether the HF fallback should use them)
  vllm        the engine of FastLanguageModel.from_pretrained(fast_inference=True), without LoRA
  vllm+merged with LoRA, handed over as merged weights (slimrl's CPU default); `sync_s` = one hand-over
  vllm+lora   with LoRA as a vLLM LoRARequest (slimrl's CUDA default; on CPU vLLM then decodes eagerly)
  grpo-hf / grpo-vllm   GRPOTrainer, patched, LoRA r=16, G=8, batch 8 × GA 2 (16 completions per step, TRL's
              default vLLM importance-sampling correction on), completions forced to --grpo_completion tokens;
              the median step time of steps 2.. (step 1 includes warm-up)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, run_self, write_results  # noqa: E402


def _prompts(tokenizer, n: int) -> list[str]:
    questions = [f"What is {a} + {b}?" for a in range(3, 40) for b in range(2, 9)][:n]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]


def _randomize_lora(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)


def child_hf(args) -> dict:
    import torch

    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", max_seq_length=1024)
    if args.lora:
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16)
        _randomize_lora(model, 0)
    FastLanguageModel.for_inference(model)
    results = {}
    for batch in args.batches:
        enc = tokenizer(_prompts(tokenizer, batch), return_tensors="pt", padding=True, add_special_tokens=False)
        mode = {
            "dynamic": {"disable_compile": True},  # what TRL's generate path uses
            "static": {"cache_implementation": "static", "disable_compile": True},
            "compile": {"cache_implementation": "static"},
        }[args.hf_mode]  # static cache + torch.compile
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=4, min_new_tokens=4, do_sample=True, **mode)  # warm-up (compiles)
            t0 = time.perf_counter()
            out = model.generate(
                **enc,
                max_new_tokens=args.completion,
                min_new_tokens=args.completion,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                **mode,
            )
            seconds = time.perf_counter() - t0
        tokens = (out.shape[1] - enc["input_ids"].shape[1]) * batch
        results[str(batch)] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 2)}
    arm = ("hf+lora" if args.lora else "hf") + ("" if args.hf_mode == "dynamic" else f"-{args.hf_mode}")
    return {"arm": arm, "dtype": str(model.dtype), "results": results}


def child_vllm(args) -> dict:
    from vllm import SamplingParams

    from slimrl import FastLanguageModel

    t0 = time.perf_counter()
    sync = args.sync or "merged"
    model, tokenizer = FastLanguageModel.from_pretrained(
        "smollm2-135m",
        max_seq_length=1024,
        fast_inference=True,
        gpu_memory_utilization=0.15,
        vllm_weight_sync=sync,
        vllm_engine_kwargs={"enforce_eager": True} if args.eager else None,
    )
    start_s = time.perf_counter() - t0
    sync_s = None
    if args.lora:
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16)
        _randomize_lora(model, 0)
        model.fast_generate(_prompts(tokenizer, 1), SamplingParams(max_tokens=2), use_adapter=True)  # hand-over
        _randomize_lora(model, 1)  # an update, as after an optimizer step
        t1 = time.perf_counter()
        model.vllm_engine.sync(model)
        sync_s = round(time.perf_counter() - t1, 3)
    results = {}
    for batch in args.batches:
        prompts = _prompts(tokenizer, batch)
        params = SamplingParams(temperature=1.0, max_tokens=args.completion, ignore_eos=True, seed=0)
        model.fast_generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_adapter=args.lora)  # warm-up
        t1 = time.perf_counter()
        outs = model.fast_generate(prompts, params, use_adapter=args.lora)  # the LoRA arms: with the adapter
        seconds = time.perf_counter() - t1
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        results[str(batch)] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 2)}
    arm = "vllm" if not args.lora else f"vllm+{sync}"
    return {"arm": arm, "eager": args.eager, "start_s": round(start_s, 1), "sync_s": sync_s, "results": results}


def child_grpo(args) -> dict:
    """GRPOTrainer (patched) on the embedded model, rollouts by HF generate or by the engine; completions forced to
    --grpo_completion tokens on both sides (HF min_new_tokens, vLLM min_tokens) so both arms decode the same."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import FastLanguageModel, PatchFastRL

    from _common import step_timer

    PatchFastRL("grpo")
    fast = args.sync is not None
    engine = (
        dict(
            fast_inference=True,
            gpu_memory_utilization=0.15,
            vllm_weight_sync=args.sync,
            vllm_engine_kwargs={"enforce_eager": True} if args.eager else None,
        )
        if fast
        else {}
    )
    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", max_seq_length=512, **engine)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16)
    questions = [f"Explain how to compute {a} + {b}." for a in range(20) for b in range(10)]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})

    def reward(completions, **kwargs):  # any reward with variance; the bench measures time
        return [float(c[0]["content"].count(" ")) for c in completions]

    length = args.grpo_completion
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-rollout-"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        num_generations=8,
        max_completion_length=length,
        learning_rate=2e-4,
        beta=0.04,
        max_steps=args.grpo_steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        generation_kwargs={"min_tokens": length} if fast else {"min_new_tokens": length},
    )
    timer = step_timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    rollout_s, generate = [], trainer._generate_single_turn

    def timed_generate(*a, **k):  # this instance only: the seconds each rollout takes (sync included)
        t0 = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            rollout_s.append(round(time.perf_counter() - t0, 2))

    trainer._generate_single_turn = timed_generate
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    later = timer.times[1:] or timer.times
    return {
        "arm": "grpo-vllm" if fast else "grpo-hf",
        "use_vllm": trainer.use_vllm,
        "step_s": [round(t, 2) for t in timer.times],
        "median_step_s": round(statistics.median(later), 2),
        "rollout_s": rollout_s,
        "median_rollout_s": round(statistics.median(rollout_s[1:] or rollout_s), 2),
        "mean_completion_len": round(statistics.mean(h["completions/mean_length"] for h in logs), 1),
        "peak_memory_gb": max(h.get("peak_memory_gb", 0) for h in logs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--grpo_steps", type=int, default=5)
    parser.add_argument("--grpo_completion", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="vLLM without graph compilation (fast start)")
    parser.add_argument(
        "--arms", nargs="+", default=["hf", "hf+lora", "vllm", "vllm+merged", "vllm+lora", "grpo-hf", "grpo-vllm"]
    )
    parser.add_argument("--quick", action="store_true", help="batch 8, completion 32, 2 GRPO steps (smoke run)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", default=results_path("rollout_speed"), help="the results file")
    parser.add_argument("--child", choices=["hf", "vllm", "grpo"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sync", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hf_mode", default="dynamic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.completion, args.grpo_steps, args.grpo_completion = [8], 32, 2, 32
    if args.child:
        pin_threads(args.threads)
        result = {"hf": child_hf, "vllm": child_vllm, "grpo": child_grpo}[args.child](args)
        print(json.dumps(result))
        return 0

    common = [
        "--batches",
        *map(str, args.batches),
        "--completion",
        str(args.completion),
        "--threads",
        str(args.threads),
        "--grpo_steps",
        str(args.grpo_steps),
        "--grpo_completion",
        str(args.grpo_completion),
    ]
    common += ["--eager"] if args.eager else []
    children = {
        "hf": ["--child", "hf"],
        "hf+lora": ["--child", "hf", "--lora"],
        "vllm": ["--child", "vllm"],
        "hf-static": ["--child", "hf", "--hf_mode", "static"],
        "hf-compile": ["--child", "hf", "--hf_mode", "compile"],
        "hf+lora-static": ["--child", "hf", "--lora", "--hf_mode", "static"],
        "hf+lora-compile": ["--child", "hf", "--lora", "--hf_mode", "compile"],
        "vllm+merged": ["--child", "vllm", "--lora", "--sync", "merged"],
        "vllm+lora": ["--child", "vllm", "--lora", "--sync", "lora"],
        "grpo-hf": ["--child", "grpo"],
        "grpo-vllm": ["--child", "grpo", "--sync", "auto"],
    }
    results = []
    for arm in args.arms:
        result = run_self(children[arm] + common, args.threads)
        result.setdefault("arm", arm)
        print(json.dumps(result), flush=True)
        results.append(result)
    by_arm = {r["arm"]: r for r in results}
    if args.markdown:
        print("\n| arm | " + " | ".join(f"tokens/s batch {b}" for b in args.batches) + " | vs HF | notes |")
        print("|---|" + "---|" * (len(args.batches) + 2))
        for r in results:
            if "results" not in r:
                continue
            ref = by_arm.get("hf+lora" if "+" in r["arm"] else "hf", {}).get("results", {})
            if not all(str(b) in ref for b in args.batches):
                ref = {}
            cells = [str(r["results"][str(b)]["tokens_per_s"]) for b in args.batches]
            ratios = [
                f"{r['results'][str(b)]['tokens_per_s'] / ref[str(b)]['tokens_per_s']:.1f}×"
                for b in args.batches
                if str(b) in ref
            ]
            notes = ", ".join(f"{k} {r[k]}" for k in ("start_s", "sync_s") if r.get(k) is not None)
            print(f"| {r['arm']} | " + " | ".join(cells) + f" | {' / '.join(ratios)} | {notes} |")
        hf, fast = by_arm.get("grpo-hf"), by_arm.get("grpo-vllm")
        if hf and fast and "median_step_s" in hf and "median_step_s" in fast:
            print(
                f"\nGRPO s/step (median of steps 2..{args.grpo_steps}): HF {hf['median_step_s']} "
                f"(rollout {hf['median_rollout_s']}) vs vLLM {fast['median_step_s']} (rollout "
                f"{fast['median_rollout_s']}); completions {hf['mean_completion_len']} / "
                f"{fast['mean_completion_len']} tokens: step ratio "
                f"{fast['median_step_s'] / hf['median_step_s']:.2f}, "
                f"rollout ratio {fast['median_rollout_s'] / hf['median_rollout_s']:.2f}"
            )
    write_results(args.json, {"config": vars(args), "results": results})
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
