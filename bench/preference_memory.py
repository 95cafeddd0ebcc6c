"""Stock TRL vs slimrl on the same preference-training run (DPO, KTO, ORPO, CPO): peak memory, step working memory,
seconds per step, and the loss of each arm.

    PYTHONPATH=src python bench/preference_memory.py --vocab 152064 --length 512 2048 --threads 1 --markdown
    PYTHONPATH=src python bench/preference_memory.py --quick --trainers dpo orpo        # smoke run, tiny sizes
    PYTHONPATH=src python bench/preference_memory.py --offload                          # slimrl arm: "offload" mode

Choices:
* Each (trainer, length, arm) runs in its own process (this script re-invoked with `--child`), one after the other,
  never in parallel, with OMP/MKL threads pinned (`--threads`, default 1: the machine is shared).
* Model: a random 4-layer, 256-wide Llama at `--vocab` (`slimrl.testing.tiny_llama`), LoRA r=16 on all projections
  through the trainer's `peft_config`, fp32 on CPU (`use_cpu=True, bf16=False`). DPO/KTO get no `ref_model`, so
  TRL uses the adapter-disabled base as reference, a no-grad forward inside every step (as TRL does with PEFT).
  ORPO/CPO are reference-free. `gradient_checkpointing` is TRL's default (True) in both arms.
* Data: random filler words "w<id>" of `slimrl.testing.tiny_tokenizer`, split on whitespace only so each is one
  token (ids drawn uniformly among the filler ids, above the ~150 named tokens). Every row has exactly `--length`
  tokens: a prompt of length//4 and a chosen/rejected (KTO: completion) answer of the rest, TRL's appended EOS
  included; `max_length = --length`, so nothing is truncated (the child records the row length it saw).
  DPO/ORPO/CPO: `--pairs` pairs per step. KTO: 2*pairs unpaired rows per step, half desirable (KTO also runs its
  no-grad KL and reference-KL forwards on mismatched pairs).
* Arms differ only by `PatchFastRL(trainer)` (same config, seed, data and model weights), so equal losses show that
  the same computation ran; the table prints the last step's loss of each arm (step 1 of DPO/KTO is log 2 = 0.693147
  whatever the data: the fresh LoRA adapter is zero, so policy = reference) and their largest relative difference
  over all steps. `--offload`: the slimrl arm's model is set up with slimrl's "offload" checkpointing
  (`slimrl.models.checkpointing.apply_checkpointing(model, "offload")`, what `FastLanguageModel(...,
  use_gradient_checkpointing="unsloth")` does); the stock arm keeps TRL's default `gradient_checkpointing=True`,
  i.e. the same layers checkpointed, the saved layer inputs kept in place. "Same config" = every decoder layer
  checkpointed in both arms; offload only moves where the saved inputs live (host memory), which on CPU is where they
  already are, so on CPU it must cost what plain checkpointing costs.
* Memory (as bench/grpo_memory.py, through bench/_common.py's VmHWM reset, the bench's own; slimrl never resets it):
  "working" = peak RSS minus RSS at `compute_loss` entry, up to the end of its `accelerator.backward`, max over
  steps (the reference forward, the policy forward and backward);
  "peak" = peak RSS of the whole process (VmHWM polled every 5 ms, folded before every reset). s/step is the mean
  over steps after the first (`--steps`, default 2). "peak" is what the targets call the step peak (the process
  peaks inside a step; slimrl logs the same reading as `peak_memory_gb`); "working" isolates what the step adds.
  Targets (V=152k, 2048-token rows): peak ratio ORPO/CPO <= 0.3, DPO/KTO <= 0.8; time ratio <= 1.05.
* `--mem_limit_gb` (default 18): a watchdog thread in each child reads /proc/self/statm every 10 ms and, once RSS
  passes the limit, prints a "stopped" record and exits with code 86. Such an arm is shown as "> LIMIT (stopped)"
  and the ratios against it as bounds ("<= slimrl/limit"). CPU only (RSS); there is no CUDA mode here.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _arms as arms  # noqa: E402
from _common import GiB, render, results_path, write_results  # noqa: E402

TRAINERS = ("dpo", "kto", "orpo", "cpo")
QUICK = {"vocab": 1024, "length": [64], "pairs": 2}


def trl_classes(trainer: str):
    if trainer in ("dpo", "kto"):
        import trl

        return {"dpo": (trl.DPOConfig, trl.DPOTrainer), "kto": (trl.KTOConfig, trl.KTOTrainer)}[trainer]
    if trainer == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOConfig, ORPOTrainer
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    return CPOConfig, CPOTrainer


def make_dataset(trainer: str, tokenizer, vocab: int, length: int, pairs: int, steps: int):
    """`steps` batches of random-token rows of exactly `length` tokens once TRL has appended EOS."""
    import random

    from datasets import Dataset

    filler = sorted(i for tok, i in tokenizer.get_vocab().items() if tok == f"w{i}")  # one token per word
    rng = random.Random(0)
    prompt_len = max(1, length // 4)
    answer_len = length - prompt_len - 1  # TRL appends EOS to every answer
    if answer_len < 1:
        raise ValueError(f"--length {length} is too short")

    def words(n: int, lead: str = "") -> str:
        return lead + " ".join(f"w{rng.choice(filler)}" for _ in range(n))

    if trainer == "kto":
        rows = 2 * pairs * steps
        labels = [True, False] * (rows // 2)  # half desirable; the same split in every batch of 2*pairs
        return Dataset.from_dict(
            {
                "prompt": [words(prompt_len) for _ in range(rows)],
                "completion": [words(answer_len, " ") for _ in range(rows)],
                "label": labels,
            }
        )
    rows = pairs * steps
    return Dataset.from_dict(
        {
            "prompt": [words(prompt_len) for _ in range(rows)],
            "chosen": [words(answer_len, " ") for _ in range(rows)],
            "rejected": [words(answer_len, " ") for _ in range(rows)],
        }
    )


def row_length(inputs: dict) -> int:
    """Longest token row in a collated batch (DPO/KTO `input_ids`; ORPO/CPO `chosen_input_ids`, ...)."""
    return max((v.shape[-1] for k, v in inputs.items() if k.endswith("input_ids") and hasattr(v, "shape")), default=0)


def child_preference(
    arm: str, trainer_name: str, vocab: int, length: int, pairs: int, steps: int, offload: bool, mem_limit_gb: float
) -> dict:
    record = {"arm": arm, "trainer": trainer_name, "vocab": vocab, "length": length, "pairs": pairs}
    state = arms.start_child(arm, trainer_name, record, mem_limit_gb)

    import tempfile

    from tokenizers import pre_tokenizers

    from slimrl.models.checkpointing import (
        apply_checkpointing,
        base_transformers_model,
        checkpointing_mode,
        is_checkpointing_active,
    )
    from slimrl.state import model_state
    from slimrl.testing import tiny_tokenizer

    config_cls, trainer_cls = trl_classes(trainer_name)
    tok = tiny_tokenizer(vocab)
    # whitespace only, so each filler word "w<id>" is one token (the default splits digits off)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model = arms.bench_model(vocab, max(4096, length))
    if offload and arm == "slimrl":
        apply_checkpointing(model, "offload")
    batch = 2 * pairs if trainer_name == "kto" else pairs
    args = config_cls(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        max_length=length,
        learning_rate=1e-4,
        **arms.CPU_TRAINING_ARGS,
    )
    trainer = trainer_cls(
        model=model,
        args=args,
        processing_class=tok,
        peft_config=arms.bench_lora(),
        train_dataset=make_dataset(trainer_name, tok, vocab, length, pairs, steps),
    )
    seen = {"row_length": 0, "checkpointing_active": None}

    def observe(model, inputs):
        seen["row_length"] = max(seen["row_length"], row_length(inputs))
        seen["checkpointing_active"] = is_checkpointing_active(model)

    result = arms.train_measured(trainer, record, state, per_step="compute_loss", observe=observe)
    stats = model_state(base_transformers_model(trainer.model)).offload_stats  # set by the "offload" mode only
    seen["offload_tensors_seen"] = None if stats is None else stats.tensors_seen
    return dict(result, step_base=state["base"], slimrl_checkpointing_mode=checkpointing_mode(trainer.model), **seen)


# ---------------------------------------------------------------------------------------------------- reporting


def _gib(r: dict, key: str, digits: int) -> str:
    if r.get("stopped"):
        return f"> {r['limit'] / GiB:.3g} (stopped)" if key == "peak" else "stopped"
    return f"{r[key] / GiB:.{digits}f}"


def _upper(r: dict, key: str) -> float:
    """What a stopped arm certainly exceeded: the limit (peak) or the limit minus its RSS before the step."""
    return r["limit"] if key == "peak" else r["limit"] - (r.get("step_base") or 0)


def _ratio(s: dict, m: dict, key: str) -> str:
    if s.get("stopped") and m.get("stopped"):
        return "n/a"
    if s.get("stopped"):
        return f"<= {m[key] / _upper(s, key):.2f}"
    if m.get("stopped"):
        return f">= {_upper(m, key) / max(s[key], 1):.2f}"
    return f"{m[key] / max(s[key], 1):.2f}"


def _loss_diff(s: dict, m: dict) -> str:
    pairs = list(zip(s.get("losses", []), m.get("losses", [])))
    if not pairs:
        return "n/a"
    return f"{max(abs(a - b) / max(abs(a), 1e-12) for a, b in pairs):.1e}"


def table_lines(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = [
        "trainer",
        "length",
        "stock peak GiB",
        "slimrl peak GiB",
        "peak ratio",
        "stock working GiB",
        "slimrl working GiB",
        "working ratio",
        "stock s/step",
        "slimrl s/step",
        "time ratio",
        "stock last loss",
        "slimrl last loss",
        "loss rel diff",
    ]
    lines = []
    for r in rows:
        s, m = r["stock"], r["slimrl"]
        if "error" in s or "error" in m:
            lines.append([r["trainer"], str(r["length"])] + ["error"] * (len(head) - 2))
            continue
        secs = [("stopped" if x.get("stopped") else f"{x['s_per_step']:.3g}") for x in (s, m)]
        time_ratio = "n/a" if s.get("stopped") or m.get("stopped") else f"{m['s_per_step'] / s['s_per_step']:.2f}"
        losses = [f"{x['losses'][-1]:.6g}" if x.get("losses") and not x.get("stopped") else "n/a" for x in (s, m)]
        lines.append(
            [
                r["trainer"],
                str(r["length"]),
                _gib(s, "peak", 2),
                _gib(m, "peak", 2),
                _ratio(s, m, "peak"),
                _gib(s, "working", 3),
                _gib(m, "working", 3),
                _ratio(s, m, "working"),
                *secs,
                time_ratio,
                *losses,
                _loss_diff(s, m),
            ]
        )
    return head, lines


def _arm_problem(length: int, mem_limit_gb: float):
    """What to say of a finished arm: stopped by the watchdog, or rows of another length than asked."""

    def problem(result: dict) -> str | None:
        if result.get("stopped"):
            return f"stopped at {result['rss_at_stop'] / GiB:.1f} GiB RSS (limit {mem_limit_gb} GiB)"
        if result["row_length"] != length:
            return f"WARNING: rows had {result['row_length']} tokens, not {length}"
        return None

    return problem


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--length", type=int, nargs="+", default=[512, 2048], help="tokens per row (prompt + answer)")
    p.add_argument("--pairs", type=int, default=4, help="preference pairs per step (KTO: 2x unpaired rows)")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    p.add_argument("--offload", action="store_true", help="slimrl arm's model in slimrl's 'offload' checkpointing")
    json_help = "the results file (bench/results/ is git-ignored; bench/results/committed/ is not)"
    arms.add_arm_options(
        p, QUICK, mem_limit_gb=18.0, json_default=results_path("preference_memory"), json_help=json_help
    )
    p.add_argument("--trainer", choices=TRAINERS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.length, a.pairs = QUICK["vocab"], QUICK["length"], QUICK["pairs"]
    if a.child:
        child_args = (a.child, a.trainer, a.vocab, a.length[0], a.pairs, a.steps, a.offload, a.mem_limit_gb)
        return arms.run_child(a.threads, child_preference, *child_args)

    common = ["--vocab", str(a.vocab), "--pairs", str(a.pairs), "--steps", str(a.steps), "--threads", str(a.threads)]
    common += ["--mem_limit_gb", str(a.mem_limit_gb)] + (["--offload"] if a.offload else [])
    rows = []
    for length in a.length:
        for trainer in a.trainers:
            row = {"trainer": trainer, "vocab": a.vocab, "length": length}
            child_args = ["--trainer", trainer, "--length", str(length), *common]
            problem = _arm_problem(length, a.mem_limit_gb)
            rows.append(arms.run_arms(row, child_args, a.threads, f"{trainer} L={length}", problem))

    ckpt = "slimrl arm 'offload', stock TRL default" if a.offload else "TRL default"
    title = (
        f"# Preference trainers, tiny Llama 4x256, LoRA r=16, V={a.vocab}, {a.pairs} pairs/step, {a.steps} "
        f"steps, fp32 CPU, {a.threads} thread(s), gradient checkpointing: {ckpt}, "
        f"memory limit {a.mem_limit_gb:g} GiB"
    )
    print(title)
    print(render(*table_lines(rows), a.markdown))
    write_results(a.json, {"title": title, "args": arms.recorded_args(a), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
