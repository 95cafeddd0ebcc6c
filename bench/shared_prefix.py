"""Shared-prefix forwards: stock TRL vs slimrl with sharing off vs slimrl with sharing on, s/step and peak memory.

    PYTHONPATH=src python bench/shared_prefix.py --threads 2 --markdown            # the measurement (quiet machine)
    PYTHONPATH=src python bench/shared_prefix.py --smoke                           # a quick check that it runs

Cases:
* `recipe`: the default `slimrl grpo` recipe (CLI_DEFAULTS: embedded SmolLM2-135M, LoRA r=16 on all projections,
  arithmetic task, 2 prompts x 8 completions of 16 tokens per step in 2 micro-batches, beta 0.04). The slimrl arms
  parse the CLI's own arguments; the stock arm loads the same weights (slimrl's loader) and gives TRL a plain peft
  LoraConfig with the same rank, alpha and target modules.
* `synthetic`: a random 4-layer, 256-wide Llama (V=32768), one 512-token prompt x G=8 completions of 128 tokens per
  step (a random model never emits EOS, so every completion is full length), LoRA r=16, TRL's defaults otherwise
  (beta 0) but gradient checkpointing off (`--gradient_checkpointing` turns it on in every arm).
* `dpo`: DPO on the same random model, 4 pairs per step of one 512-token prompt with 128-token chosen and rejected
  completions (LoRA r=16, adapter-disabled reference, beta 0.1): the prompt once for chosen and rejected.
* `orpo`, `cpo`: TRL's experimental ORPO and CPO (sigmoid) trainers on the same model and pairs (LoRA r=16, no
  reference model); slimrl's lean concatenated forward in both slimrl arms, the prompt once per pair in `slimrl-on`.
* `vllm`: the recipe with `--fast_inference` (slimrl arms only: the engine is slimrl's); skipped with a message where
  vLLM is not installed.

Choices: every (case, arm) runs in its own process, one after another, threads pinned (`--threads`); s/step is the
mean over steps after the first; peak is the process's peak RSS (VmHWM polled every 5 ms) or torch's CUDA peak;
`fwd s` / `bwd s` per step are the time inside `_get_per_token_logps_and_entropies` (policy, old and reference
forwards; DPO: `_compute_loss`, policy and reference forwards; ORPO/CPO: `concatenated_forward`) and inside the
backward; `positions` is forwarded / per-row positions (slimrl's counter, `shared_prefix_stats`; 1.00 = no sharing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import GiB, OverallPeak, pin_threads, results_path, run_self, step_timer, write_results  # noqa: E402

ARMS = ("stock", "slimrl-off", "slimrl-on")
SHARING = {"slimrl-off": False, "slimrl-on": "auto"}


def _recipe_slimrl(arm: str, steps: int, smoke: bool, fast_inference: bool, out: str):
    from slimrl.cli.args import parse_grpo_args
    from slimrl.cli.grpo import apply_patches, build_task
    from slimrl.cli.modeling import add_lora, load_base

    apply_patches()
    argv = ["--max_steps", str(steps), "--output_dir", out, "--num_eval_samples", "0", "--disable_tqdm", "True"]
    argv += ["--max_completion_length", "8"] if smoke else []
    argv += ["--fast_inference", "True", "--vllm_enforce_eager", "True"] if fast_inference else []
    task_args, model_args, args = parse_grpo_args(argv)
    args.slimrl_shared_prefix = SHARING[arm]
    model, tokenizer = load_base(
        model_args.model_name_or_path, model_args.max_seq_length, model_args.dtype, model_args.load_in_4bit, model_args
    )
    model = add_lora(model, model_args, bool(args.gradient_checkpointing), args.seed)
    return dict(model=model, args=args, processing_class=tokenizer, task=build_task(task_args, args.seed))


def _recipe_stock(steps: int, smoke: bool, out: str):
    from peft import LoraConfig
    from trl import GRPOConfig

    from slimrl.cli.args import CLI_DEFAULTS, ModelArguments
    from slimrl.cli.grpo import build_task
    from slimrl.models.loading import load_model_and_tokenizer
    from slimrl.models.lora import default_target_modules

    fields = {k: v for k, (v, _) in CLI_DEFAULTS.items()}
    fields.update(output_dir=out, max_steps=steps, bf16=False, disable_tqdm=True)
    if smoke:
        fields["max_completion_length"] = 8
    args = GRPOConfig(**fields)
    margs = ModelArguments()
    model, tokenizer, _ = load_model_and_tokenizer(margs.model_name_or_path, margs.max_seq_length)
    lora = LoraConfig(
        r=margs.lora_r,
        lora_alpha=margs.lora_alpha,
        lora_dropout=margs.lora_dropout,
        bias="none",
        target_modules=default_target_modules(model),
        task_type="CAUSAL_LM",
    )
    task_args = type(
        "TaskArgs",
        (),
        dict(
            dataset_name=None,
            reward_funcs=None,
            task="arithmetic",
            num_train_samples=None,
            num_eval_samples=0,
            max_operand=None,
            operations=None,
            num_examples=None,
        ),
    )()
    return dict(
        model=model, args=args, processing_class=tokenizer, peft_config=lora, task=build_task(task_args, args.seed)
    )


def _tiny(arm: str, smoke: bool, algorithm: str = "grpo"):
    """The random 4 x 256 model, its tokenizer, and prompt / completion texts of exact token counts."""
    import random

    from slimrl.testing import tiny_llama, tiny_tokenizer

    if arm != "stock":
        from slimrl.patches.registry import PatchFastRL

        PatchFastRL(algorithm)
    prompt_len, completion = (64, 16) if smoke else (512, 128)
    vocab = 32768
    tokenizer = tiny_tokenizer(vocab)
    model = tiny_llama(
        vocab_size=vocab, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, max_position_embeddings=4096
    )
    rng = random.Random(0)
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha())

    def text(n):  # n word-level tokens
        return " ".join(rng.choices(words, k=n))

    assert len(tokenizer(text(prompt_len)).input_ids) == prompt_len
    return model, tokenizer, text, prompt_len, completion


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COMMON = dict(
    max_steps=None,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    learning_rate=1e-5,
    bf16=False,
    seed=0,
    disable_tqdm=True,
)


def _synthetic(arm: str, steps: int, smoke: bool, checkpointing: bool, out: str):
    import random

    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig

    model, tokenizer, text, prompt_len, completion = _tiny(arm, smoke)
    extra = {} if arm == "stock" else {"slimrl_shared_prefix": SHARING[arm]}
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=completion,
        gradient_checkpointing=checkpointing,
        **{**COMMON, "max_steps": steps},
        **extra,
    )
    lora = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)

    def rewards(completions, **kw):
        return [random.random() for _ in completions]

    data = Dataset.from_dict({"prompt": [text(prompt_len) for _ in range(64)]})
    task = type("Task", (), dict(train_dataset=data, reward_funcs=[rewards]))()
    return dict(model=model, args=args, processing_class=tokenizer, peft_config=lora, task=task)


# case -> (module, config class, trainer class, the timed seam, config fields of the case)
PREFERENCE = {
    "dpo": ("trl", "DPOConfig", "DPOTrainer", "_compute_loss", {}),
    "orpo": ("trl.experimental.orpo", "ORPOConfig", "ORPOTrainer", "concatenated_forward", {}),
    "cpo": ("trl.experimental.cpo", "CPOConfig", "CPOTrainer", "concatenated_forward", {"loss_type": "sigmoid"}),
}


def _preference(case: str, arm: str, steps: int, smoke: bool, checkpointing: bool, out: str):
    """The trainer class and its arguments for a paired-preference case (DPO, ORPO, CPO)."""
    from datasets import Dataset
    from peft import LoraConfig

    module, config_name, trainer_name, _, fields = PREFERENCE[case]
    model, tokenizer, text, prompt_len, completion = _tiny(arm, smoke, case)
    module = importlib.import_module(module)
    extra = {} if arm == "stock" else {"slimrl_shared_prefix": SHARING[arm]}
    args = getattr(module, config_name)(
        output_dir=out,
        per_device_train_batch_size=4,
        max_length=prompt_len + completion + 8,
        gradient_checkpointing=checkpointing,
        **{**COMMON, "max_steps": steps},
        **fields,
        **extra,
    )
    lora = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)
    n = 4 * (steps + 1)
    data = Dataset.from_dict(
        {
            "prompt": [text(prompt_len) for _ in range(n)],
            "chosen": [" " + text(completion) for _ in range(n)],
            "rejected": [" " + text(completion) for _ in range(n)],
        }
    )
    return getattr(module, trainer_name), dict(
        model=model, args=args, processing_class=tokenizer, peft_config=lora, train_dataset=data
    )


def _timed(trainer, name: str, totals: dict, owner=None):
    """Accumulate the wall time of `owner.name` (default: the trainer's method) into totals[name]."""
    owner = owner or trainer
    inner = getattr(owner, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0

    setattr(owner, name, wrapper)


def child(case: str, arm: str, steps: int, smoke: bool, checkpointing: bool) -> dict:
    import torch

    from slimrl.patches.scoring.shared_prefix import shared_prefix_stats

    out = tempfile.mkdtemp(prefix="slimrl-bench-sp-")
    if case in PREFERENCE:
        trainer_cls, parts = _preference(case, arm, steps, smoke, checkpointing, out)
        trainer, seam = trainer_cls(**parts), PREFERENCE[case][3]
    else:
        from trl import GRPOTrainer

        if case == "synthetic":
            parts = _synthetic(arm, steps, smoke, checkpointing, out)
        elif arm == "stock":
            parts = _recipe_stock(steps, smoke, out)
        else:
            parts = _recipe_slimrl(arm, steps, smoke, case == "vllm", out)
        task = parts.pop("task")
        trainer = GRPOTrainer(reward_funcs=task.reward_funcs, train_dataset=task.train_dataset, **parts)
        seam = "_get_per_token_logps_and_entropies"
    totals: dict[str, float] = {}
    _timed(trainer, seam, totals)
    _timed(trainer, "backward", totals, owner=trainer.accelerator)
    cuda = torch.cuda.is_available()
    overall = None if cuda else OverallPeak()
    timer = step_timer()
    trainer.add_callback(timer)
    trainer.train()
    timed = timer.times[1:] or timer.times
    n = len(timer.times)
    peak = torch.cuda.max_memory_allocated() if cuda else overall.stop()
    stats = shared_prefix_stats(trainer) if arm != "stock" else None
    counted = stats is not None and stats.positions_per_row_path > 0  # sharing off: the seam never counts
    positions = stats.positions_forwarded / stats.positions_per_row_path if counted else 1.0
    return {
        "case": case,
        "arm": arm,
        "steps": n,
        "s_per_step": sum(timed) / len(timed),
        "peak": peak,
        "fwd_s": totals.get(seam, 0.0) / n,
        "bwd_s": totals.get("backward", 0.0) / n,
        "positions": positions,
        "reasons": dict(stats.reasons) if stats else {},
    }


def _ratio(row: dict, base: dict | None, key: str) -> str:
    return f"{row[key] / base[key]:.2f}" if base else ""


def _table(rows: list[dict], markdown: bool) -> str:
    head = ["case", "arm", "s/step", "vs stock", "vs off", "peak GiB", "vs off", "fwd s", "bwd s", "positions"]
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by_arm = {r["arm"]: r for r in rows if r["case"] == case and "error" not in r}
        for r in (r for r in rows if r["case"] == case):
            if "error" in r:
                lines.append([case, r["arm"], "error"] + [""] * 7)
                continue
            stock, off = by_arm.get("stock"), by_arm.get("slimrl-off")
            lines.append(
                [
                    case,
                    r["arm"],
                    f"{r['s_per_step']:.2f}",
                    _ratio(r, stock, "s_per_step"),
                    _ratio(r, off, "s_per_step"),
                    f"{r['peak'] / GiB:.2f}",
                    _ratio(r, off, "peak"),
                    f"{r['fwd_s']:.2f}",
                    f"{r['bwd_s']:.2f}",
                    f"{r['positions']:.2f}",
                ]
            )
    if markdown:
        return "\n".join(
            ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(line) + " |" for line in lines]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [head, *lines])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cases = ["recipe", "synthetic", *PREFERENCE, "vllm"]
    p.add_argument("--cases", nargs="+", default=cases, choices=cases)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is not timed)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP/MKL threads per process (1 if shared)")
    p.add_argument("--smoke", action="store_true", help="2 steps, 64/16-token synthetic rows, 8-token answers")
    p.add_argument("--gradient_checkpointing", action="store_true", help="all but recipe: checkpointing on")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", default=results_path("shared_prefix"), help="the results file")
    p.add_argument("--child", nargs=2, metavar=("CASE", "ARM"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    steps = 2 if a.smoke else a.steps

    if a.child:
        pin_threads(a.threads)
        print(json.dumps(child(*a.child, steps, a.smoke, a.gradient_checkpointing)), flush=True)
        return 0

    rows = []
    for case in a.cases:
        if case == "vllm" and importlib.util.find_spec("vllm") is None:
            print(
                "# vllm case skipped: vLLM is not installed (bash scripts/install_vllm.sh, then run this script "
                "with .venv-vllm/bin/python)",
                flush=True,
            )
            continue
        for arm in a.arms:
            if case == "vllm" and arm == "stock":
                continue  # the engine is slimrl's: there is no stock-TRL arm with it
            extra = ["--smoke"] if a.smoke else []
            extra += ["--gradient_checkpointing"] if a.gradient_checkpointing else []
            row = run_self(
                ["--child", case, arm, "--steps", str(steps), "--threads", str(a.threads), *extra], a.threads
            )
            row.setdefault("case", case)
            row.setdefault("arm", arm)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"# shared-prefix forwards, {steps} steps per run, {a.threads} thread(s){' (smoke)' if a.smoke else ''}")
    print(_table(rows, a.markdown))
    write_results(a.json, rows)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
