"""slimrl's memory planner against measured step peaks: the table of README.md, "Planning memory before a run".

    PYTHONPATH=src python bench/plan_accuracy.py                    # the three runs of tests/planning (~5-15 min)
    PYTHONPATH=src python bench/plan_accuracy.py --only head kv --json out.json
    PYTHONPATH=src python bench/plan_accuracy.py --smoke            # one tiny run: checks the script works (~20 s)

Choices:
* The runs are tests/planning/test_plan_accuracy.py's CONFIGS (one owner: the test), each measured in its own process
  by tests/planning/_measure_step.py (one torch thread, CPU, each optimizer step's peak RSS, steps after the first,
  rollouts included), planned by the same helper the test uses. Peak RSS barely depends on machine load, so a shared
  machine gives usable figures; runs are sequential, never in parallel.
* The table lists measured, planned, their ratio and the planned peak phase and largest term.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "planning"))

from test_plan_accuracy import CONFIGS  # noqa: E402

import _measure_step as M  # noqa: E402

SMOKE = {
    "smoke": {
        "algorithm": "grpo",
        "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
        "lora": {"r": 4},
        "prompt_length": 8,
        "completion_length": 8,
        "steps": 2,
        "config": {"per_device_train_batch_size": 4, "num_generations": 4, "gradient_accumulation_steps": 1},
    }
}


def row(name: str, spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="slimrl-plan-") as out:
        spec = {**spec, "output_dir": out}
        planned = M.plan_for(spec, device_memory_gb=64)
        measured = M.measure(spec)["peak_bytes"]
    terms = {t.name: t.bytes for ts in planned.phases.values() for t in ts}
    return {
        "run": name,
        "measured_gib": round(measured / 2**30, 3),
        "planned_gib": round(planned.peak_gb, 3),
        "ratio": round(planned.peak_bytes / measured, 3),
        "peak_phase": planned.peak_phase,
        "largest_term": max(terms, key=terms.get),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs = SMOKE if args.smoke else {k: v for k, v in CONFIGS.items() if not args.only or k in args.only}
    rows = []
    print("| run | measured GiB | planned GiB | planned / measured | peak phase | largest term |")
    print("|---|---|---|---|---|---|")
    for name, spec in runs.items():
        r = row(name, spec)
        rows.append(r)
        print(
            f"| {r['run']} | {r['measured_gib']} | {r['planned_gib']} | {r['ratio']} | {r['peak_phase']} | "
            f"{r['largest_term']} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
