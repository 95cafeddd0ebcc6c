"""What slimrl adds to a rollout: one GRPO step's generation inside a patched trainer vs `model.generate` of the same
weights and tokens on a model slimrl never touched.

    PYTHONPATH=src python bench/rollout_overhead.py --markdown --json bench/results/committed/rollout_overhead.json
    PYTHONPATH=src python bench/rollout_overhead.py --smoke                 # every config, tiny sizes (the test)

Choices:
* Configs (`--configs`), each in its own process, one after the other: "16bit" (the embedded SmolLM2-135M-Instruct
  in slimrl's default dtype: bf16 on a CPU with AVX512-BF16), "4bit" (bitsandbytes NF4, bf16 compute), each with
  "+sft" (a short patched SFTTrainer run on the model first, so its swaps are on the model the GRPO trainer gets) and
  "16bit+levers" (the long-context levers forced on: row groups of 2, padding-free, the MLP tiled from 16 tokens).
  slimrl's model: FastLanguageModel.from_pretrained + get_peft_model (LoRA r=16 on every projection).
* The reference: the same weights loaded by transformers (and bitsandbytes for 4-bit, with slimrl's CPU repack guard
  set the same way, models/quantization.py) with the same LoRA adapter through PEFT, its LoRA weights copied from
  slimrl's model before every call; eval mode, `model.generate(input_ids, attention_mask, generation_config=` the
  trainer's own GenerationConfig`)`, the prompts padded as TRL pads them. Every completion is forced to
  `--completion` tokens (`min_new_tokens`), so both sides decode the same number of tokens.
* Interleaved in one process: the patched GRPOTrainer trains `--repeats` + 1 steps (the first a warm-up); inside
  each step's rollout (`_generate_single_turn` wrapped on the trainer instance) the rollout and the reference run
  back to back on the same prompt ids, in alternating order, each after `torch.manual_seed` with the same seed, so
  the machine's load hits both alike and `same_tokens` says whether they sampled the same completions. 4-bit adds a
  third arm: the reference inside slimrl's `dequantized_once` (models/dequantized_generate.py): what bitsandbytes'
  per-token dequantizing costs.
* Reported: every repeat's seconds, the medians over the repeats after the warm-up, and the ratio rollout /
  generate (of the medians, and the median of the per-repeat ratios); the goal is <= 1.2. `stacked_swaps`: any
  attribute of the model swapped more than once (a head or swap installed twice), which should be none.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, render, results_path, run_self, write_results  # noqa: E402

CONFIGS = ("16bit", "16bit+sft", "16bit+levers", "4bit", "4bit+sft")
LEVERS = {"slimrl_rows_per_group": 2, "slimrl_padding_free": True, "slimrl_tiled_mlp": 16}
GOAL = 1.2


def _questions(n: int, offset: int = 0) -> list[str]:
    return [f"Explain step by step how to compute {a} + {a + 7}." for a in range(offset, offset + n)]


def slimrl_model(four_bit: bool):
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained("smollm2-135m", max_seq_length=512, load_in_4bit=four_bit)
    return FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, random_state=0), tokenizer


def reference_model(model, four_bit: bool):
    """The same weights and adapter through transformers, bitsandbytes and PEFT alone."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from slimrl.models.embedded import embedded_model_path

    kwargs = dict(dtype=model.dtype)
    if four_bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=model.dtype
        )
        kwargs["device_map"] = "cpu"
    base = AutoModelForCausalLM.from_pretrained(embedded_model_path(), **kwargs)
    if four_bit:
        import bitsandbytes as bnb

        for module in base.modules():
            if isinstance(module, bnb.nn.Linear4bit):
                module.support_avx512bf16_for_cpu = False  # as slimrl loads it (models/quantization.py)
    return get_peft_model(base, copy.deepcopy(model.peft_config["default"])).eval()


def copy_lora(model, reference) -> None:
    import torch

    mine = dict(reference.named_parameters())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                mine[name].data = param.detach().clone()  # the values and their dtype


def run_sft(model, tokenizer, steps: int, batch: int) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from slimrl import PatchFastRL

    PatchFastRL("sft")
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}, {"role": "assistant", "content": "Add the tens, then the ones."}],
            tokenize=False,
        )
        for q in _questions(steps * batch, offset=100)
    ]
    args = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-sft-"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=1e-4,
        max_length=128,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
    )
    SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}), processing_class=tokenizer
    ).train()


def stacked_swaps(model) -> list[str]:
    """Attributes of the model's modules swapped more than once (a head or swap installed twice)."""
    from slimrl.state import swap_records

    found = []
    for name, module in model.named_modules():
        for attr, stack in (swap_records(module, create=False) or {}).items():
            if len(stack) > 1:
                found.append(f"{name or 'model'}.{attr} x{len(stack)}")
    return found


def reference_generate(reference, trainer, prompt_ids: list, dequantized: bool):
    """The reference model's `generate` on the prompts as TRL pads them; returns (seconds, completion id lists)."""
    import torch
    from trl.trainer.utils import pad

    from slimrl.models.dequantized_generate import dequantized_once

    rows = [torch.tensor(ids) for ids in prompt_ids]
    input_ids = pad(rows, padding_value=trainer._tokenizer.pad_token_id, padding_side="left")
    mask = pad([torch.ones_like(r) for r in rows], padding_value=0, padding_side="left")
    with torch.no_grad():
        if dequantized:
            with dequantized_once(reference):
                out = reference.generate(
                    input_ids=input_ids, attention_mask=mask, generation_config=trainer.generation_config
                )
        else:
            out = reference.generate(
                input_ids=input_ids, attention_mask=mask, generation_config=trainer.generation_config
            )
    return out[:, input_ids.shape[1] :].tolist()


def interleave(trainer, model, reference, four_bit: bool, records: list) -> None:
    """Wrap this trainer's rollout: each call also runs the reference arms on the same prompts, order alternating."""
    import torch

    rollout = trainer._generate_single_turn

    def interleaved(prompt_ids, *args, **kwargs):
        repeat, result = len(records), {}
        seed = 1000 + len(records)

        def arm_rollout():
            result["out"] = rollout(prompt_ids, *args, **kwargs)
            return [list(c) for c in result["out"][0]]

        def arm_reference(dequantized):
            return reference_generate(reference, trainer, prompt_ids, dequantized)

        arms = {"rollout": arm_rollout, "generate": lambda: arm_reference(False)}
        if four_bit:
            arms["generate_dequantized"] = lambda: arm_reference(True)
        names = list(arms) if repeat % 2 == 0 else list(reversed(arms))
        copy_lora(model, reference)
        record, tokens = {"repeat": repeat, "warmup": repeat == 0, "order": names}, {}
        for name in names:
            torch.manual_seed(seed)
            wall, cpu = time.perf_counter(), time.process_time()
            tokens[name] = arms[name]()
            record[f"{name}_s"] = round(time.perf_counter() - wall, 3)
            record[f"{name}_cpu_s"] = round(time.process_time() - cpu, 3)
        record["tokens"] = sum(len(c) for c in tokens["rollout"])
        record["same_tokens"] = {name: tokens[name] == tokens["rollout"] for name in arms if name != "rollout"}
        records.append(record)
        return result["out"]

    trainer._generate_single_turn = interleaved  # this instance only


def child(args) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL

    four_bit, config = args.child.startswith("4bit"), args.child
    torch.manual_seed(0)
    model, tokenizer = slimrl_model(four_bit)
    sft_s = None
    if "+sft" in config:
        t0 = time.perf_counter()
        run_sft(model, tokenizer, args.sft_steps, batch=4)
        sft_s = round(time.perf_counter() - t0, 1)
    reference = reference_model(model, four_bit)
    PatchFastRL("grpo")
    levers = LEVERS if "+levers" in config else {}
    prompts = [[{"role": "user", "content": q}] for q in _questions(args.repeats + 1)]
    grpo = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-rollout-"),
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_completion_length=args.completion,
        generation_kwargs={"min_new_tokens": args.completion},
        learning_rate=1e-5,
        beta=0.0,
        max_steps=args.repeats + 1,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **levers,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(str(c))) for c in completions],
        args=grpo,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    records: list[dict] = []
    interleave(trainer, model, reference, four_bit, records)
    trainer.train()
    return summary(config, records, dtype=str(model.dtype), sft_s=sft_s, stacked=stacked_swaps(model), levers=levers)


def summary(config: str, records: list[dict], **extra) -> dict:
    timed = [r for r in records if not r["warmup"]] or records
    arms = [k[:-2] for k in records[0] if k.endswith("_s") and not k.endswith("_cpu_s")]
    out = {"config": config, **extra, "repeats": records}
    for clock in ("s", "cpu_s"):
        medians = {arm: round(statistics.median(r[f"{arm}_{clock}"] for r in timed), 3) for arm in arms}
        out[f"median_{clock}"] = medians
        out[f"ratio_{clock}"] = round(medians["rollout"] / medians["generate"], 3)
        out[f"paired_ratio_{clock}"] = round(
            statistics.median(r[f"rollout_{clock}"] / r[f"generate_{clock}"] for r in timed), 3
        )
        if "generate_dequantized" in medians:
            out[f"per_token_vs_dequantized_{clock}"] = round(medians["generate"] / medians["generate_dequantized"], 3)
    out["same_tokens"] = {arm: all(r["same_tokens"][arm] for r in records) for arm in records[0]["same_tokens"]}
    return out


def table(results: list[dict], markdown: bool) -> str:
    """Medians, wall and CPU seconds; the CPU clock is the one other jobs on a shared machine disturb least."""
    head = ["config", "rollout s (cpu)", "generate s (cpu)", "ratio (cpu)", "paired (cpu)", "same tokens"]
    head.append("generate, dequantized once s (cpu)")
    lines = []
    for r in results:
        if "error" in r:
            lines.append([r.get("config", "?"), "error"] + [""] * 5)
            continue
        wall = r["median_s"]

        def pair(arm, r=r):
            return f"{r['median_s'][arm]} ({r['median_cpu_s'][arm]})"

        same = ", ".join(f"{arm} {same}" for arm, same in r["same_tokens"].items())
        dq = ""
        if "generate_dequantized" in wall:
            dq = f"{pair('generate_dequantized')}: per token {r['per_token_vs_dequantized_cpu_s']}x (cpu)"
        lines.append(
            [r["config"], pair("rollout"), pair("generate"), f"{r['ratio_s']}x ({r['ratio_cpu_s']}x)"]
            + [f"{r['paired_ratio_s']}x ({r['paired_ratio_cpu_s']}x)", same, dq]
        )
    return render(head, lines, markdown)


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--repeats", type=int, default=4, help="timed GRPO steps after a warm-up step")
    parser.add_argument("--completion", type=int, default=48, help="tokens per completion (forced)")
    parser.add_argument("--batch", type=int, default=8, help="completions per rollout (num_generations)")
    parser.add_argument("--sft_steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="1 timed repeat, 2 x 4 tokens, 1 SFT step")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", default=results_path("rollout_overhead"), help="the results file")
    parser.add_argument("--child", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.completion, args.batch, args.sft_steps = 1, 4, 2, 1
    if args.child:
        pin_threads(args.threads)
        print(json.dumps(child(args)))
        return 0
    common = [f"--{k}={getattr(args, k)}" for k in ("repeats", "completion", "batch", "sft_steps", "threads")]
    results = []
    for config in args.configs:
        result = run_self(["--child", config, *common], args.threads)
        result.setdefault("config", config)
        print(json.dumps({k: v for k, v in result.items() if k != "repeats"}), flush=True)
        results.append(result)
    print(table(results, args.markdown))
    write_results(args.json, {"config": vars(args), "goal_ratio": GOAL, "results": results})
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
