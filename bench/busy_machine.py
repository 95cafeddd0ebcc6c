"""A CPU GRPO step on a busy machine: how much slower it gets beside N competing processes, per thread setting
(the CLI's default is the one that degrades least).

    python bench/busy_machine.py                      # small random model, 2 competitors, every arm, 2 repeats
    python bench/busy_machine.py --model embedded     # the bare `slimrl grpo` case (SmolLM2-135M, CLI geometry)
    python bench/busy_machine.py --quick              # smoke: tiny model, 1 competitor, 3 arms, 2 steps

Choices:
1. Arms are thread settings of the measured process, set in its environment before torch is imported (libgomp reads
   them once): `default` (torch's own: no OMP_NUM_THREADS, no OMP_WAIT_POLICY), `passive` (OMP_WAIT_POLICY=PASSIVE:
   idle OpenMP threads sleep instead of spinning), `threads=K` (OMP_NUM_THREADS=MKL_NUM_THREADS=K), and
   combinations joined by `+` (`passive+threads=1`). The script removes those variables from its own environment
   first, so `default` is torch's default even when the caller exported OMP_NUM_THREADS.
2. Each arm runs quiet (no competitor) and busy (N competitors started a second before it), each in a fresh process,
   interleaved over --repeats rounds so a drift of the machine hits every arm alike. The figure is the median wall
   seconds of an optimizer step after --warmup steps; slowdown = busy / quiet of the same arm; the recommendation is
   the arm with the lowest busy median (its quiet cost is shown beside it).
3. A competitor is "another job": `torch` (default) runs float32 matmuls with torch's default
   threads (another training), `spin` a single-threaded Python loop. Each reports its work rate, so an arm that
   is fast only by starving the others shows it (column `rival it/s`).
4. --cores N pins every process (measured and competitors) to the first N cores this process may use, to reproduce
   the 2-core case on a larger machine. Memory is not measured here (see bench/grpo_memory.py).
Results: bench/results/busy_machine.json and a markdown table on stdout. Measure on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from _common import spawn_pinned

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# model presets: (model kwargs for slimrl.testing.tiny_llama or "embedded", GRPOConfig geometry)
PRESETS = {
    "tiny": (
        dict(vocab_size=512, hidden_size=32, num_layers=2),
        dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=1, max_completion_length=8),
    ),
    "small": (
        dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1024),
        dict(per_device_train_batch_size=8, num_generations=8, gradient_accumulation_steps=2, max_completion_length=32),
    ),
    "embedded": (
        "smollm2-135m",  # `slimrl grpo`'s CLI defaults: 2 prompts x 8 completions, 16 new tokens
        dict(per_device_train_batch_size=8, num_generations=8, gradient_accumulation_steps=2, max_completion_length=16),
    ),
}


def arm_env(arm: str, base: dict) -> dict:
    """The measured process's environment for an arm spec like `passive+threads=1`."""
    env = {k: v for k, v in base.items() if k not in THREAD_VARS}
    for part in arm.split("+"):
        if part == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        elif part.startswith("threads="):
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(int(part.split("=", 1)[1]))
        elif part != "default":
            raise SystemExit(f"unknown arm part {part!r}: use default, passive, threads=K, joined by '+'")
    return env


# ---- the measured process ----
def length_reward(completions, **kwargs):
    return [len(c) % 7 / 7 for c in completions]


def build_trainer(preset: str, steps: int, timer):
    import torch

    from slimrl import FastLanguageModel, PatchFastRL
    from slimrl.testing import tiny_llama, tiny_tokenizer

    PatchFastRL("grpo", FastLanguageModel)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_spec, geometry = PRESETS[preset]
    if model_spec == "smollm2-135m":
        model, tokenizer = FastLanguageModel.from_pretrained(model_spec, max_seq_length=512)
    else:
        model, tokenizer = tiny_llama(0, **model_spec), tiny_tokenizer(model_spec["vocab_size"])
    model = FastLanguageModel.get_peft_model(
        model, r=16, lora_alpha=16, random_state=0, use_gradient_checkpointing=False
    )
    prompts = [f"What is {a} + {b}? Answer:" for a in range(10) for b in range(10)]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="busy-"),
        max_steps=steps,
        learning_rate=2e-4,
        beta=0.04,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        **geometry,
    )
    torch.manual_seed(0)
    return GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[timer],
    )


def worker(spec: dict) -> None:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import torch

    from _common import step_timer

    timer = step_timer()
    trainer = build_trainer(spec["preset"], spec["warmup"] + spec["steps"], timer)
    trainer.train()
    measured = timer.times[spec["warmup"] :]
    print(json.dumps({"times": measured, "median": statistics.median(measured), "threads": torch.get_num_threads()}))


# ---- competitors ----
def compete(kind: str, report: str) -> None:
    done, start = [0], time.perf_counter()

    def finish(*_):
        with open(report, "w") as f:
            json.dump({"iterations_per_s": done[0] / (time.perf_counter() - start)}, f)
        os._exit(0)

    signal.signal(signal.SIGTERM, finish)
    if kind == "torch":
        import torch

        a = torch.randn(1024, 1024)
        while True:
            a = torch.tanh(a @ a.T / 1024)
            done[0] += 1
    x = 0
    while True:
        for i in range(100_000):
            x += i * i
        done[0] += 1


def run_arm(arm: str, busy: int, opts, base_env: dict, cores) -> dict:
    rivals, reports = [], []
    for i in range(busy):
        reports.append(os.path.join(tempfile.mkdtemp(prefix="busy-rival-"), f"rival{i}.json"))
        rival = ["--_compete", opts.competitor, "--_report", reports[-1]]
        rivals.append(spawn_pinned(__file__, rival, arm_env("default", base_env), cores))
    if rivals:
        time.sleep(opts.ramp)
    spec = {"preset": opts.model, "steps": opts.steps, "warmup": opts.warmup}
    try:
        proc = spawn_pinned(
            __file__,
            ["--_worker", json.dumps(spec)],
            arm_env(arm, base_env),
            cores,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=opts.timeout)
    finally:
        for rival in rivals:  # only the processes this script started, by their own handle
            rival.send_signal(signal.SIGTERM)
        for rival in rivals:
            rival.wait(timeout=30)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"arm {arm} (busy={busy}) failed with exit code {proc.returncode}:\n{err[-3000:]}")
    result = json.loads(lines[-1])
    rates = []
    for report in reports:
        if os.path.isfile(report):
            with open(report) as f:
                rates.append(json.load(f)["iterations_per_s"])
    result["rival_rate"] = sum(rates) / len(rates) if rates else None
    return result


def default_arms(cores: int) -> list[str]:
    fewer = sorted({max(1, cores // 2), 1}, reverse=True)
    arms = ["default", "passive", *(f"threads={k}" for k in fewer if k < cores)]
    return arms + [f"passive+threads={fewer[0]}"] if fewer[0] < cores else arms


def summarize(results: dict, arms: list[str], competitors: int) -> list[dict]:
    rows = []
    for arm in arms:
        quiet = statistics.median(r["median"] for r in results[arm]["quiet"])
        busy = statistics.median(r["median"] for r in results[arm]["busy"])
        rates = [r["rival_rate"] for r in results[arm]["busy"] if r["rival_rate"] is not None]
        rows.append(
            {
                "arm": arm,
                "threads": results[arm]["quiet"][0]["threads"],
                "quiet_s": quiet,
                "busy_s": busy,
                "slowdown": busy / quiet,
                "rival_rate": statistics.median(rates) if rates else None,
                "competitors": competitors,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", choices=list(PRESETS), default="small")
    parser.add_argument("--competitors", type=int, default=2, help="competing processes in the busy runs")
    parser.add_argument("--competitor", choices=("torch", "spin"), default="torch")
    parser.add_argument("--arms", nargs="*", help="arm specs (default: default, passive, fewer threads, passive+fewer)")
    parser.add_argument("--steps", type=int, default=5, help="measured optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="optimizer steps not measured")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every arm, quiet and busy")
    parser.add_argument("--cores", type=int, default=None, help="pin everything to this many cores")
    parser.add_argument("--ramp", type=float, default=1.0, help="seconds the competitors run before the measured one")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--quick", action="store_true", help="smoke: tiny model, 1 competitor, 3 arms, 1+1 steps")
    parser.add_argument("--output", default=None, help="default: bench/results/busy_machine[_quick].json")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_compete", help=argparse.SUPPRESS)
    parser.add_argument("--_report", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts._worker:
        worker(json.loads(opts._worker))
        return 0
    if opts._compete:
        compete(opts._compete, opts._report)
        return 0
    if opts.quick:
        opts.model, opts.competitors, opts.steps, opts.warmup, opts.repeats, opts.ramp = "tiny", 1, 1, 1, 1, 0.5
        opts.arms = opts.arms or ["default", "passive", "threads=1"]
    opts.output = opts.output or os.path.join(
        ROOT, "bench", "results", "busy_machine_quick.json" if opts.quick else "busy_machine.json"
    )
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    cores = allowed[: opts.cores] if opts.cores else None
    arms = opts.arms or default_arms(len(cores or allowed))
    base_env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    base_env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + base_env.get("PYTHONPATH", "")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"cores {len(cores or allowed)}, load average {load}, arms {arms}, model {opts.model}", flush=True)
    results = {arm: {"quiet": [], "busy": []} for arm in arms}
    for round_ in range(opts.repeats):
        for arm in arms:
            for kind, busy in (("quiet", 0), ("busy", opts.competitors)):
                result = run_arm(arm, busy, opts, base_env, cores)
                results[arm][kind].append(result)
                print(f"round {round_ + 1} {arm:<20} {kind:<5} {result['median']:.3f} s/step", flush=True)
    rows = summarize(results, arms, opts.competitors)
    best = min(rows, key=lambda r: r["busy_s"])
    print(f"\n| arm | torch threads | quiet s/step | {opts.competitors} competitors s/step | slowdown | rival it/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rate = f"{r['rival_rate']:.2f}" if r["rival_rate"] is not None else "-"
        print(
            f"| {r['arm']} | {r['threads']} | {r['quiet_s']:.3f} | {r['busy_s']:.3f} | {r['slowdown']:.2f}x | {rate} |"
        )
    print(f"\nleast degraded beside {opts.competitors} {opts.competitor} competitors: {best['arm']}")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from _common import write_results

    write_results(
        opts.output,
        {
            "options": {k: v for k, v in vars(opts).items() if not k.startswith("_")},
            "cores": len(cores or allowed),
            "load_before": load,
            "rows": rows,
            "raw": results,
            "best": best["arm"],
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
