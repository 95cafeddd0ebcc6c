"""Do exported models answer as the adapter does? Greedy answers on held-out arithmetic prompts, side by side.

    python bench/export_roundtrip.py --adapter outputs/run1 --gguf outputs/run1-gguf/model.F16.gguf \
        outputs/run1-gguf/model.Q8_0.gguf --merged outputs/run1-merged --n 32

The adapter loads on its base as `slimrl generate` loads it; each GGUF loads through FastLanguageModel.from_pretrained
(slimrl's GGUF loader); a merged folder through plain transformers. All run in `--dtype` (float32 by default, so
the comparison sees the export, not bf16 rounding). Prompts are the built-in task's held-out split wrapped as
training wrapped them (the run's slimrl_run.json), decoded greedily with the run's completion length. Printed: per
model, how many completions equal the adapter's exactly (and, for scale, how many of the base model's do), how
many agree on the first `--prefix_tokens` tokens, how many get the same correctness score, and the accuracy; plus
file sizes. JSON to --out if given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, write_results  # noqa: E402


def _sizes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


def _answers(model, tokenizer, prompts, max_new_tokens):
    from slimrl.cli.evaluate import generate_texts

    return generate_texts(model, tokenizer, prompts, max_new_tokens, batch_size=8)


def _prefix_agrees(tokenizer, a: str, b: str, tokens: int) -> bool:
    return (
        tokenizer(a, add_special_tokens=False).input_ids[:tokens]
        == tokenizer(b, add_special_tokens=False).input_ids[:tokens]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--gguf", nargs="*", default=[])
    parser.add_argument("--merged", nargs="*", default=[])
    parser.add_argument("--n", type=int, default=32, help="held-out prompts")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prefix_tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=results_path("export_roundtrip"), help="the results file")
    args = parser.parse_args()
    pin_threads(args.threads)

    import torch
    from transformers import AutoModelForCausalLM

    from slimrl import FastLanguageModel
    from slimrl.cli.modeling import load_adapter
    from slimrl.tasks import get_builtin_task

    dtype = getattr(torch, args.dtype)
    adapter, tokenizer, info = load_adapter(args.adapter, dtype=args.dtype)
    options = {
        k: v for k, v in (info.get("task_info") or {}).items() if k in ("max_operand", "operations", "num_examples")
    }
    task = get_builtin_task(
        info.get("task") or "arithmetic",
        num_train_samples=8,
        num_eval_samples=args.n,
        seed=info.get("seed", 42),
        **options,
    )
    prompts = list(task.eval_dataset["prompt"])
    max_new = info.get("max_completion_length") or 16
    columns = {k: list(task.eval_dataset[k]) for k in task.eval_dataset.column_names if k != "prompt"}

    def scores(texts):
        wrapped = [[{"role": "assistant", "content": t}] for t in texts]
        return [float(s or 0.0) for s in task.accuracy_reward(prompts=prompts, completions=wrapped, **columns)]

    reference = _answers(adapter, tokenizer, prompts, max_new)
    reference_scores = scores(reference)
    with adapter.disable_adapter():  # how far the adapter moved the base: the bar the exports are read against
        base = _answers(adapter, tokenizer, prompts, max_new)
    base_exact = sum(a == b for a, b in zip(base, reference))
    results = {
        "adapter": {
            "accuracy": sum(reference_scores) / len(prompts),
            "correct": int(sum(reference_scores)),
            "n": len(prompts),
            "base_exact": base_exact,
            "differs_from_base": len(prompts) - base_exact,
            "base_accuracy": sum(scores(base)) / len(prompts),
        }
    }
    candidates = [(p, "gguf") for p in args.gguf] + [(p, "merged") for p in args.merged]
    for path, kind in candidates:
        if kind == "gguf":
            model, model_tokenizer = FastLanguageModel.from_pretrained(path, dtype=dtype)
        else:
            model, model_tokenizer = AutoModelForCausalLM.from_pretrained(path, dtype=dtype), tokenizer
        texts = _answers(model.eval(), model_tokenizer, prompts, max_new)
        got = scores(texts)
        results[path] = {
            "bytes": _sizes(path),
            "MB": round(_sizes(path) / 1e6, 1),
            "accuracy": sum(got) / len(prompts),
            "exact": sum(a == b for a, b in zip(texts, reference)),
            "prefix": sum(_prefix_agrees(tokenizer, a, b, args.prefix_tokens) for a, b in zip(texts, reference)),
            "same_score": sum(a == b for a, b in zip(got, reference_scores)),
            "examples": [(r, t) for r, t in zip(reference, texts)][:3],
        }
        del model
    for name, row in results.items():
        print(name, json.dumps({k: v for k, v in row.items() if k != "examples"}))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
