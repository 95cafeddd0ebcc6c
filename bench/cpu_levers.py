"""The long-context levers at the main job's size on a CPU: one GRPO step of bare `slimrl grpo` with each lever
"auto" and with it off, time and working memory.

    PYTHONPATH=src python bench/cpu_levers.py --threads 1 --repeats 3 --json bench/results/committed/cpu_levers.json

Choices:
* The run is bare `slimrl grpo`'s: its parser and defaults (embedded SmolLM2-135M-Instruct, arithmetic task, LoRA
  r=16, 8 completions a micro-batch, 2 micro-batches a step, 16 new tokens, beta 0.04, no gradient checkpointing),
  loaded and built as the CLI does, `--max_steps` steps; only the three lever fields differ between configs.
* Configs: "off" (the three levers False), "auto" (the three "auto"), each lever "auto" alone, and "auto" where
  free memory reads 512 MiB (a loaded machine: row groups' "auto" sizes its groups by free memory). The config
  "auto" is what the default `slimrl grpo` runs.
* Each (config, repeat) runs in its own process (this script re-invoked with `--child`), the configs interleaved
  (off, auto, ..., off, auto, ...), never two at once, threads pinned; medians over the repeats. On a shared machine
  compare configs within one run only.
* Measured in the last step: "forward s" = seconds inside `compute_loss` (the policy forward, and a row group's
  backward where groups run), "step s" = one `training_step` (generation and scoring included, so the two
  micro-batches' steps are summed), "working MiB" = the largest RSS high-water mark of a `training_step` minus the RSS
  when it started (bench/_common.PhasePeak). What each lever did is read from slimrl's counters
  (`slimrl.describe(trainer).counters`) and the decision from `slimrl.describe(trainer)`'s lever reasons.
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
from _common import PhasePeak, pin_threads, render, results_path, run_self, write_results  # noqa: E402

MiB = 1024**2
LEVERS = ("slimrl_rows_per_group", "slimrl_padding_free", "slimrl_tiled_mlp")
CONFIGS = {
    "off": dict.fromkeys(LEVERS, False),
    "auto": dict.fromkeys(LEVERS, "auto"),
    "rows auto": dict(dict.fromkeys(LEVERS, False), slimrl_rows_per_group="auto"),
    "padding-free auto": dict(dict.fromkeys(LEVERS, False), slimrl_padding_free="auto"),
    "tiled MLP auto": dict(dict.fromkeys(LEVERS, False), slimrl_tiled_mlp="auto"),
    "auto, 512 MiB free": dict.fromkeys(LEVERS, "auto"),
}
AVAILABLE = {"auto, 512 MiB free": 512 * MiB}  # config -> the free memory row groups' "auto" reads (a loaded machine)


def _timed(record: list, fn):
    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            record.append(time.perf_counter() - t0)

    return timed


def child(config: str, steps: int) -> dict:
    from slimrl.cli.grpo import apply_patches, build_task

    apply_patches()
    from trl import GRPOTrainer

    import slimrl
    from slimrl.cli.args import parse_grpo_args
    from slimrl.cli.modeling import add_lora, load_base

    out = tempfile.mkdtemp(prefix="slimrl-bench-")
    task_args, model_args, args = parse_grpo_args(["--max_steps", str(steps), "--output_dir", out, "--plot", "False"])
    if config in AVAILABLE:
        import slimrl.ops.row_groups as row_groups

        row_groups.free_memory_bytes = lambda device: AVAILABLE[config]
    for name, value in CONFIGS[config].items():
        setattr(args, name, value)
    task = build_task(task_args, args.seed)
    model, tokenizer = load_base(model_args.model_name_or_path, model_args.max_seq_length, model_args.dtype)
    model = add_lora(model, model_args, bool(args.gradient_checkpointing), args.seed)
    trainer = GRPOTrainer(
        model=model, reward_funcs=task.reward_funcs, args=args, train_dataset=task.train_dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    forward, micro = [], []
    trainer.compute_loss = _timed(forward, trainer.compute_loss)
    step = trainer.training_step

    def measured_step(*a, **kw):
        peak = PhasePeak()
        base = peak.start()
        t0 = time.perf_counter()
        result = step(*a, **kw)
        micro.append({"seconds": time.perf_counter() - t0, "working": peak.stop()[1] - base})
        return result

    trainer.training_step = measured_step
    trainer.train()
    per_step = len(micro) // steps
    last, forwards = micro[-per_step:], forward[-per_step:]
    description = slimrl.describe(trainer)
    return {
        "config": config,
        "fields": CONFIGS[config],
        "forward_s": sum(forwards),
        "step_s": sum(m["seconds"] for m in last),
        "working": max(m["working"] for m in last),
        "micro_steps": micro,
        "rows": args.per_device_train_batch_size,
        "counters": description.counters,
        "levers": getattr(description, "levers", None),
    }


def summary(results: list[dict]) -> list[dict]:
    rows = []
    for config in CONFIGS:
        runs = [r for r in results if r.get("config") == config and "error" not in r]
        if runs:
            rows.append(
                {
                    "config": config,
                    "runs": len(runs),
                    "forward_s": statistics.median(r["forward_s"] for r in runs),
                    "step_s": statistics.median(r["step_s"] for r in runs),
                    "working_mib": statistics.median(r["working"] for r in runs) / MiB,
                }
            )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=1, help="optimizer steps a process (the last is measured)")
    p.add_argument("--json", default=results_path("cpu_levers"))
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        pin_threads(a.threads)
        print(json.dumps(child(a.child, a.steps), default=str), flush=True)
        return 0
    results = []
    for repeat in range(a.repeats):
        for config in a.configs:
            record = run_self(["--child", config, "--threads", str(a.threads), "--steps", str(a.steps)], a.threads)
            results.append(record | {"config": config, "repeat": repeat})
            print(json.dumps({k: v for k, v in results[-1].items() if k != "micro_steps"}, default=str), flush=True)
    rows = summary(results)
    print(f"# bare `slimrl grpo`, last of {a.steps} steps, {a.threads} thread(s), medians of {a.repeats} processes")
    table = [
        [r["config"], f"{r['forward_s']:.1f}", f"{r['step_s']:.1f}", f"{r['working_mib']:.0f}", str(r["runs"])]
        for r in rows
    ]
    print(render(["config", "forward s", "step s", "working MiB", "runs"], table, a.markdown))
    write_results(a.json, {"setup": vars(a), "summary": rows, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
