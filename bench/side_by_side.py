"""Two patched GRPO trainings side by side on the same cores, through the Python API (no CLI): each one's step time
beside the other against its time alone.

    python bench/side_by_side.py --cores 2                 # small random model, both arms, alone/together/staggered
    python bench/side_by_side.py --cores 2 --model embedded
    python bench/side_by_side.py --cores 2 --steps 30 --scenarios staggered   # long enough for the later job
    python bench/side_by_side.py --quick                   # smoke: tiny model, 2+2 steps, no stagger

Choices:
1. Arms: `slimrl` (no thread variables: slimrl's busy-machine policy, applied when a patched trainer is built and
   again between steps, slimrl/machine.py) and `keep` (SLIMRL_THREADS=keep: torch's default threads, the collapse
   the policy exists for). The jobs are bench/busy_machine.py's measured process (same model presets and GRPO
   geometry), each in its own fresh process.
2. Scenarios: `alone` (one job), `together` (two jobs started at once) and `staggered` (the second starts
   --stagger seconds after the first, once the first is training: only the between-steps look can react to it).
3. A step counts as side by side when it began and ended while both jobs were training (from the later one's first
   step to the earlier one's last); slowdown = the median of those steps / the median step of the same arm alone.
   Every step's start, end and length is in the JSON. Warm-up steps are not measured.
Results: bench/results/side_by_side.json (--output to change) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from _common import spawn_pinned  # noqa: E402

ARMS = {"slimrl": {}, "keep": {"SLIMRL_THREADS": "keep"}}
SCENARIOS = ("alone", "together", "staggered")


def worker(spec: dict) -> None:
    import torch
    from busy_machine import build_trainer
    from transformers import TrainerCallback

    class Stamps(TrainerCallback):
        def __init__(self):
            self.steps: list[tuple[float, float]] = []

        def on_step_begin(self, *a, **kw):
            self.begin = time.time()

        def on_step_end(self, *a, **kw):
            self.steps.append((self.begin, time.time()))

    stamps = Stamps()
    trainer = build_trainer(spec["preset"], spec["warmup"] + spec["steps"], stamps)
    trainer.train()
    print(json.dumps({"steps": stamps.steps[spec["warmup"] :], "threads": torch.get_num_threads()}))


def _spawn(spec: dict, env: dict, cores: list[int] | None) -> subprocess.Popen:
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return spawn_pinned(__file__, ["--_worker", json.dumps(spec)], env, cores, **pipes)


def _collect(proc: subprocess.Popen, timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"a job failed with exit code {proc.returncode}:\n{err[-3000:]}")
    result = json.loads(lines[-1])
    result["notices"] = [line for line in err.splitlines() if "torch threads" in line]
    return result


def run_scenario(scenario: str, arm: str, opts, base_env: dict, cores) -> list[dict]:
    env = dict(base_env, **ARMS[arm])
    spec = {"preset": opts.model, "steps": opts.steps, "warmup": opts.warmup}
    first = _spawn(spec, env, cores)
    procs = [first]
    if scenario != "alone":
        if scenario == "staggered":
            time.sleep(opts.stagger)
        procs.append(_spawn(spec, env, cores))
    return [_collect(p, opts.timeout) for p in procs]


def side_by_side_steps(jobs: list[dict]) -> list[list[float]]:
    """Per job, the lengths of its steps that began and ended while both jobs were training (choice 3)."""
    start = max(job["steps"][0][0] for job in jobs)
    end = min(job["steps"][-1][1] for job in jobs)
    return [[e - b for b, e in job["steps"] if b >= start and e <= end] for job in jobs]


def summarize(raw: dict) -> list[dict]:
    rows = []
    for arm, scenarios in raw.items():
        alone = statistics.median(e - b for b, e in scenarios["alone"][0]["steps"])
        for scenario in ("together", "staggered"):
            if scenario not in scenarios:
                continue
            for i, steps in enumerate(side_by_side_steps(scenarios[scenario])):
                median = statistics.median(steps) if steps else None
                rows.append(
                    {
                        "arm": arm,
                        "scenario": scenario,
                        "job": i + 1,
                        "alone_s": alone,
                        "side_by_side_s": median,
                        "steps_side_by_side": len(steps),
                        "slowdown": median / alone if median else None,
                        "threads_at_end": scenarios[scenario][i]["threads"],
                    }
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "small", "embedded"), default="small")
    parser.add_argument("--arms", nargs="*", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--steps", type=int, default=8, help="measured optimizer steps per job")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stagger", type=float, default=20.0, help="seconds before the staggered second job starts")
    parser.add_argument("--scenarios", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--cores", type=int, default=None, help="pin every job to this many cores")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--quick", action="store_true", help="smoke: tiny model, 2+1 steps, alone and together")
    parser.add_argument("--output", default=None, help="default: bench/results/side_by_side[_quick].json")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts._worker:
        worker(json.loads(opts._worker))
        return 0
    scenarios = ["alone", *(s for s in opts.scenarios if s != "alone")]  # alone: every slowdown's denominator
    if opts.quick:
        opts.model, opts.steps, opts.warmup, scenarios = "tiny", 2, 1, ["alone", "together"]
    opts.output = opts.output or os.path.join(
        ROOT, "bench", "results", "side_by_side_quick.json" if opts.quick else "side_by_side.json"
    )
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    cores = allowed[: opts.cores] if opts.cores else None
    from busy_machine import THREAD_VARS

    base_env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARS, "SLIMRL_THREADS")}
    base_env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    base_env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + base_env.get("PYTHONPATH", "")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"cores {len(cores or allowed)}, load average {load}, arms {opts.arms}, model {opts.model}", flush=True)
    raw = {arm: {} for arm in opts.arms}
    for scenario in scenarios:
        for arm in opts.arms:
            raw[arm][scenario] = run_scenario(scenario, arm, opts, base_env, cores)
            print(f"{arm:<7} {scenario:<10} threads at end {[j['threads'] for j in raw[arm][scenario]]}", flush=True)
    rows = summarize(raw)
    print("\n| arm | scenario | job | alone s/step | side by side s/step | steps | slowdown |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        side = f"{r['side_by_side_s']:.3f} | {r['steps_side_by_side']} | {r['slowdown']:.2f}x" if r["slowdown"] else "-"
        print(f"| {r['arm']} | {r['scenario']} | {r['job']} | {r['alone_s']:.3f} | {side} |")
    from _common import write_results

    options = {k: v for k, v in vars(opts).items() if not k.startswith("_")}
    write_results(
        opts.output, {"options": options, "cores": len(cores or allowed), "load_before": load, "rows": rows, "raw": raw}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
