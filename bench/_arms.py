"""The stock-vs-slimrl arms of the CPU memory benches (distill_memory, preference_memory, online_memory,
async_grpo_memory): their shared options, the arm loop (each arm is `python <script> --child ARM ...` in its own
process, one after the other), a child's start (memory watchdog, `PatchFastRL` in the slimrl arm), its model and
LoRA, its measured training (bench/_common.py's per-phase peaks) and the options a results file records.
"""

from __future__ import annotations

import argparse
import json
import sys

from _common import GiB, OverallPeak, PhasePeak, pin_threads, run_self, start_watchdog, step_timer

ARMS = ("stock", "slimrl")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# the training arguments of every arm (each bench adds its trainer's own): fp32 on CPU, no logging or checkpoint files
CPU_TRAINING_ARGS = dict(
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    bf16=False,
    seed=0,
    dataloader_pin_memory=False,
)
JSON_HELP = "also write the rows (raw numbers) to this file"
NOT_RECORDED = ("child", "trainer")  # the options of a child process, left out of the results file's `args`


def add_arm_options(parser, quick: dict, mem_limit_gb: float, json_default=None, json_help=JSON_HELP) -> None:
    """The options every arm bench has, and the hidden `--child ARM` its arms are run with."""
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps; s/step is the mean after the first")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")
    parser.add_argument("--mem_limit_gb", type=float, default=mem_limit_gb, help="stop an arm whose RSS passes this")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", default=json_default, help=json_help)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)


def run_child(threads: int, child, *args) -> int:
    """In a child process: pin the threads (before torch is imported), run `child(*args)` and print its record as the
    last JSON line (what `run_self` reads back)."""
    pin_threads(threads)
    print(json.dumps(child(*args)), flush=True)
    return 0


def run_arms(row: dict, child_args: list[str], threads: int, where: str, problem=None) -> dict:
    """Both arms of `row`, each `--child ARM *child_args` in its own process pinned to `threads`, one after the other.
    An arm's error, or what `problem(result)` finds in it, goes to stderr as `[name ARM size] ...` (`where`: "name
    size", e.g. "dpo L=512"); then the row, as a JSON line."""
    name, size = where.split(" ", 1)
    for arm in ARMS:
        result = row[arm] = run_self(["--child", arm, *child_args], threads)
        message = result.get("error") or (problem(result) if problem is not None else None)
        if message:
            print(f"[{name} {arm} {size}] {message}", file=sys.stderr)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def start_child(arm: str, algorithm: str, record: dict, mem_limit_gb: float) -> dict:
    """A child's start: the watchdog that stops it past `mem_limit_gb` (printing `record`), then `PatchFastRL` in the
    slimrl arm. Returns the state the watchdog reports from (`base`: RSS at the step's start; `losses`)."""
    state = {"base": None, "losses": []}
    start_watchdog(int(mem_limit_gb * GiB), record, state)
    if arm == "slimrl":
        from slimrl.patches.registry import PatchFastRL

        PatchFastRL(algorithm)
    return state


def bench_model(vocab: int, max_positions: int = 4096, hidden_size: int = 256, seed: int = 0):
    """The benches' random 4-layer Llama (4 heads, 2 KV heads) at `vocab`, fp32."""
    from slimrl.testing import tiny_llama

    size = dict(num_layers=4, num_heads=4, num_kv_heads=2, max_position_embeddings=max_positions)
    return tiny_llama(seed=seed, vocab_size=vocab, hidden_size=hidden_size, **size)


def bench_lora():
    """LoRA r=16 on every projection."""
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)


def measure_loss_steps(trainer, phase: PhasePeak, state: dict, observe=None) -> list[int]:
    """Wrap `compute_loss` and `accelerator.backward`: the returned list gets each step's working memory (peak RSS
    from `compute_loss` entry to the end of its backward, minus RSS at entry), `state["losses"]` its loss;
    `observe(model, inputs)` sees every batch."""
    working = []
    compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward

    def measured_compute_loss(model, inputs, *a, **kw):
        state["base"] = phase.start()
        if observe is not None:
            observe(model, inputs)
        out = compute_loss(model, inputs, *a, **kw)
        state["losses"].append(float((out[0] if isinstance(out, tuple) else out).detach()))
        return out

    def measured_backward(*a, **kw):
        out = backward(*a, **kw)
        base, peak = phase.stop()
        working.append(peak - base)
        return out

    trainer.compute_loss, trainer.accelerator.backward = measured_compute_loss, measured_backward
    return working


def measure_training_steps(trainer, phase: PhasePeak, state: dict) -> list[int]:
    """Wrap `training_step`: the returned list gets each step's working memory (its peak RSS minus RSS at its
    entry), `state["losses"]` its loss."""
    working = []
    training_step = trainer.training_step

    def measured_step(*a, **kw):
        state["base"] = phase.start()
        loss = training_step(*a, **kw)
        base, peak = phase.stop()
        working.append(peak - base)
        state["losses"].append(float(loss))
        return loss

    trainer.training_step = measured_step
    return working


def train_measured(trainer, record: dict, state: dict, per_step: str = "training_step", observe=None) -> dict:
    """`trainer.train()` with each step's working memory measured around `per_step` ("training_step", or
    "compute_loss" up to the end of its backward); the arm's record: steps, whole-process peak, largest working
    memory, seconds per step (mean after the first), losses."""
    overall = OverallPeak()
    if per_step == "training_step":
        working = measure_training_steps(trainer, PhasePeak(overall), state)
    else:
        working = measure_loss_steps(trainer, PhasePeak(overall), state, observe)
    timer = step_timer()
    trainer.add_callback(timer)
    trainer.train()
    timed = timer.times[1:] or timer.times
    return dict(
        record,
        stopped=False,
        steps=len(timer.times),
        peak=overall.stop(),
        working=max(working),
        s_per_step=sum(timed) / len(timed),
        losses=state["losses"],
    )


def recorded_args(args) -> dict:
    """The command's options as the results file records them (a child's own left out)."""
    return {k: v for k, v in vars(args).items() if k not in NOT_RECORDED}
