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
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import GiB, OverallPeak, PhasePeak, pin_threads, render, run_self, start_watchdog, step_timer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINERS = ("dpo", "kto", "orpo", "cpo")
QUICK = {"vocab": 1024, "length": [64], "pairs": 2}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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
    state = {"base": None, "losses": []}
    start_watchdog(int(mem_limit_gb * GiB), record, state)

    import tempfile

    from peft import LoraConfig
    from tokenizers import pre_tokenizers

    if arm == "slimrl":
        from slimrl.patches.registry import PatchFastRL

        PatchFastRL(trainer_name)
    from slimrl.models.checkpointing import (
        apply_checkpointing,
        base_transformers_model,
        checkpointing_mode,
        is_checkpointing_active,
    )
    from slimrl.state import model_state
    from slimrl.testing import tiny_llama, tiny_tokenizer

    config_cls, trainer_cls = trl_classes(trainer_name)
    tok = tiny_tokenizer(vocab)
    # whitespace only, so each filler word "w<id>" is one token (the default splits digits off)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model = tiny_llama(
        vocab_size=vocab,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=max(4096, length),
    )
    if offload and arm == "slimrl":
        apply_checkpointing(model, "offload")
    batch = 2 * pairs if trainer_name == "kto" else pairs
    args = config_cls(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        max_length=length,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        learning_rate=1e-4,
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_pin_memory=False,
    )
    lora = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)
    trainer = trainer_cls(
        model=model,
        args=args,
        processing_class=tok,
        peft_config=lora,
        train_dataset=make_dataset(trainer_name, tok, vocab, length, pairs, steps),
    )

    overall = OverallPeak()
    phase, working, seen = PhasePeak(overall), [], {"row_length": 0, "checkpointing_active": None}
    compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward

    def measured_compute_loss(model, inputs, *a, **kw):
        state["base"] = phase.start()
        seen["row_length"] = max(seen["row_length"], row_length(inputs))
        seen["checkpointing_active"] = is_checkpointing_active(model)
        out = compute_loss(model, inputs, *a, **kw)
        loss = out[0] if isinstance(out, tuple) else out
        state["losses"].append(float(loss.detach()))
        return out

    def measured_backward(*a, **kw):
        out = backward(*a, **kw)
        base, peak = phase.stop()
        working.append(peak - base)
        return out

    trainer.compute_loss, trainer.accelerator.backward = measured_compute_loss, measured_backward

    timer = step_timer()
    trainer.add_callback(timer)
    trainer.train()
    step_times = timer.times
    timed = step_times[1:] or step_times
    stats = model_state(base_transformers_model(trainer.model)).offload_stats  # set by the "offload" mode only
    seen["offload_tensors_seen"] = None if stats is None else stats.tensors_seen
    return dict(
        record,
        stopped=False,
        steps=len(step_times),
        peak=overall.stop(),
        working=max(working),
        step_base=state["base"],
        s_per_step=sum(timed) / len(timed),
        losses=state["losses"],
        slimrl_checkpointing_mode=checkpointing_mode(trainer.model),
        **seen,
    )


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--length", type=int, nargs="+", default=[512, 2048], help="tokens per row (prompt + answer)")
    p.add_argument("--pairs", type=int, default=4, help="preference pairs per step (KTO: 2x unpaired rows)")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    p.add_argument("--steps", type=int, default=2, help="optimizer steps; s/step is the mean after the first")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    p.add_argument("--offload", action="store_true", help="slimrl arm's model in slimrl's 'offload' checkpointing")
    p.add_argument("--mem_limit_gb", type=float, default=18.0, help="stop an arm whose RSS passes this (GiB)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument(
        "--json",
        default=os.path.join(ROOT, "bench", "results", "preference_memory.json"),
        help="where the rows are written (bench/results/ is git-ignored)",
    )
    p.add_argument("--child", choices=["stock", "slimrl"], help=argparse.SUPPRESS)
    p.add_argument("--trainer", choices=TRAINERS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.length, a.pairs = QUICK["vocab"], QUICK["length"], QUICK["pairs"]

    if a.child:
        pin_threads(a.threads)
        res = child_preference(a.child, a.trainer, a.vocab, a.length[0], a.pairs, a.steps, a.offload, a.mem_limit_gb)
        print(json.dumps(res), flush=True)
        return 0

    common = [
        "--vocab",
        str(a.vocab),
        "--pairs",
        str(a.pairs),
        "--steps",
        str(a.steps),
        "--threads",
        str(a.threads),
        "--mem_limit_gb",
        str(a.mem_limit_gb),
    ] + (["--offload"] if a.offload else [])
    rows = []
    for length in a.length:
        for trainer in a.trainers:
            row = {"trainer": trainer, "vocab": a.vocab, "length": length}
            for arm in ("stock", "slimrl"):
                row[arm] = run_self(["--child", arm, "--trainer", trainer, "--length", str(length), *common], a.threads)
                if "error" in row[arm]:
                    print(f"[{trainer} {arm} L={length}] {row[arm]['error']}", file=sys.stderr)
                elif row[arm].get("stopped"):
                    print(
                        f"[{trainer} {arm} L={length}] stopped at {row[arm]['rss_at_stop'] / GiB:.1f} GiB RSS "
                        f"(limit {a.mem_limit_gb} GiB)",
                        file=sys.stderr,
                    )
                elif row[arm]["row_length"] != length:
                    print(
                        f"[{trainer} {arm}] WARNING: rows had {row[arm]['row_length']} tokens, not {length}",
                        file=sys.stderr,
                    )
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)

    ckpt = "slimrl arm 'offload', stock TRL default" if a.offload else "TRL default"
    title = (
        f"# Preference trainers, tiny Llama 4x256, LoRA r=16, V={a.vocab}, {a.pairs} pairs/step, {a.steps} "
        f"steps, fp32 CPU, {a.threads} thread(s), gradient checkpointing: {ckpt}, "
        f"memory limit {a.mem_limit_gb:g} GiB"
    )
    print(title)
    print(render(*table_lines(rows), a.markdown))
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(
            {"title": title, "args": {k: v for k, v in vars(a).items() if k not in ("child", "trainer")}, "rows": rows},
            f,
            indent=2,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
