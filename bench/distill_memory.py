"""Stock TRL vs slimrl on the same distillation run (GKD, GOLD, DistillationTrainer): peak memory, step working
memory, seconds per step, and the loss of each arm.

    PYTHONPATH=src python bench/distill_memory.py --vocab 152064 --length 512 --threads 1 --markdown
    PYTHONPATH=src python bench/distill_memory.py --quick --trainers gkd            # smoke run, tiny sizes

Choices:
* Each (trainer, length, arm) runs in its own process (this script re-invoked with `--child`), one after the other,
  with OMP/MKL threads pinned (`--threads`, default 1: the machine is shared). Arms differ only by
  `PatchFastRL(trainer)`: same config, seed, data and weights, so equal losses show the same computation ran.
* Models, fp32 on CPU: the student a random 4-layer, 256-wide Llama at `--vocab` with LoRA r=16 on all projections
  (the trainer's `peft_config`); the teacher a larger random model of the same vocabulary (4 layers, 384 wide).
  Gradient checkpointing is TRL's default in both arms.
* Data: random filler words of `slimrl.testing.tiny_tokenizer`, one token each. GKD / GOLD: `--rows` ChatML
  conversations per step, a user turn of length//4 words and an assistant turn of the rest, trained off-policy
  (`lmbda=0`: both arms would generate the same completions, which costs the same in both). Distillation (always
  on-policy): `--rows` prompts of length//4 words, completions of the rest sampled by the student, forced to full
  length (`min_new_tokens`), so both arms score the same number of tokens; the generation is outside the measured
  window.
* Memory (bench/_common.py, as bench/preference_memory.py): "working" = peak RSS minus RSS at `compute_loss` entry, up
  to the end of its `accelerator.backward`, max over steps (both models' forwards, the loss, the backward); "peak" =
  peak RSS of the whole process. The target: working ratio <= 0.25 at V=152k.
* `--mem_limit_gb`: a watchdog stops an arm whose RSS passes it; its ratios become bounds.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from preference_memory import table_lines  # noqa: E402

import _arms as arms  # noqa: E402
from _common import render, results_path, write_results  # noqa: E402

TRAINERS = ("gkd", "gold", "distillation")
QUICK = {"vocab": 1024, "length": [48], "rows": 2}


def trl_classes(trainer: str):
    if trainer == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        return GKDConfig, GKDTrainer
    if trainer == "gold":
        from trl.experimental.gold import GOLDConfig, GOLDTrainer

        return GOLDConfig, GOLDTrainer
    import trl

    return trl.DistillationConfig, trl.DistillationTrainer


def make_dataset(trainer: str, tokenizer, length: int, rows: int, steps: int):
    import random

    from datasets import Dataset

    filler = sorted(i for tok, i in tokenizer.get_vocab().items() if tok == f"w{i}")
    rng = random.Random(0)
    prompt_len = max(1, length // 4)

    def words(n: int) -> str:
        return " ".join(f"w{rng.choice(filler)}" for _ in range(n))

    n = rows * steps
    if trainer == "distillation":
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": words(prompt_len)}] for _ in range(n)]})
    turns = [(words(prompt_len), words(length - prompt_len - 8)) for _ in range(n)]  # 8: the ChatML markers
    return Dataset.from_dict(
        {"messages": [[{"role": "user", "content": u}, {"role": "assistant", "content": a}] for u, a in turns]}
    )


def make_config(trainer: str, output_dir: str, length: int, rows: int, steps: int):
    config_cls, _ = trl_classes(trainer)
    common = dict(
        output_dir=output_dir,
        per_device_train_batch_size=rows,
        max_steps=steps,
        learning_rate=1e-4,
        beta=0.5,
        **arms.CPU_TRAINING_ARGS,
    )
    if trainer == "gkd":
        return config_cls(**common, max_length=length, lmbda=0.0, max_new_tokens=8)
    if trainer == "gold":
        return config_cls(**common, max_length=length, lmbda=0.0, max_completion_length=8, use_extended_uld=False)
    completion = length - max(1, length // 4) - 5  # the ChatML prompt adds 5 tokens
    return config_cls(**common, max_completion_length=completion, generation_kwargs={"min_new_tokens": completion})


def row_length(inputs) -> int:
    if "input_ids" in inputs:
        return inputs["input_ids"].shape[-1]
    return inputs["prompt_ids"].shape[-1] + inputs["completion_ids"].shape[-1]


def child_distill(arm: str, trainer_name: str, vocab: int, length: int, rows: int, steps: int, limit_gb: float):
    record = {"arm": arm, "trainer": trainer_name, "vocab": vocab, "length": length, "rows": rows}
    state = arms.start_child(arm, trainer_name, record, limit_gb)

    import tempfile

    from tokenizers import pre_tokenizers

    from slimrl.testing import tiny_tokenizer

    _, trainer_cls = trl_classes(trainer_name)
    tok = tiny_tokenizer(vocab)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # each filler word is one token
    max_positions = max(4096, length)
    trainer = trainer_cls(
        model=arms.bench_model(vocab, max_positions, hidden_size=256, seed=0),
        teacher_model=arms.bench_model(vocab, max_positions, hidden_size=384, seed=1),
        args=make_config(trainer_name, tempfile.mkdtemp(prefix="slimrl-bench-"), length, rows, steps),
        processing_class=tok,
        peft_config=arms.bench_lora(),
        train_dataset=make_dataset(trainer_name, tok, length, rows, steps),
    )
    seen = {"row_length": 0}

    def observe(model, inputs):
        seen["row_length"] = max(seen["row_length"], row_length(inputs))

    result = arms.train_measured(trainer, record, state, per_step="compute_loss", observe=observe)
    return dict(result, step_base=state["base"], **seen)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--length", type=int, nargs="+", default=[512], help="tokens per row (prompt + completion)")
    p.add_argument("--rows", type=int, default=2, help="rows (conversations or prompts) per step")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    arms.add_arm_options(
        p, QUICK, mem_limit_gb=14.0, json_default=results_path("distill_memory"), json_help="the results file"
    )
    p.add_argument("--trainer", choices=TRAINERS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.length, a.rows = QUICK["vocab"], QUICK["length"], QUICK["rows"]
    if a.child:
        return arms.run_child(
            a.threads, child_distill, a.child, a.trainer, a.vocab, a.length[0], a.rows, a.steps, a.mem_limit_gb
        )

    common = ["--vocab", str(a.vocab), "--rows", str(a.rows), "--steps", str(a.steps), "--threads", str(a.threads)]
    common += ["--mem_limit_gb", str(a.mem_limit_gb)]
    rows = []
    for length in a.length:
        for trainer in a.trainers:
            row = {"trainer": trainer, "vocab": a.vocab, "length": length}
            child_args = ["--trainer", trainer, "--length", str(length), *common]
            rows.append(arms.run_arms(row, child_args, a.threads, f"{trainer} L={length}"))
    title = (
        f"# Distillation trainers, student Llama 4x256 + LoRA r=16, teacher Llama 4x384, V={a.vocab}, {a.rows} "
        f"rows/step, {a.steps} steps, fp32 CPU, {a.threads} thread(s), memory limit {a.mem_limit_gb:g} GiB"
    )
    print(title)
    print(render(*table_lines(rows), a.markdown))
    write_results(a.json, {"title": title, "args": arms.recorded_args(a), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
