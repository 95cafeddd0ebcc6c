"""GRPO on one GPU, stock TRL against slimrl and Unsloth: the peak and s/step of each arm at 8 rows x 8K (8B-class
Qwen2.5 shapes, LoRA r=16, bf16), the longest completion that fits with 8 rows a step, DPO/ORPO at 2 x 4K, with
slimrl's memory plan beside every measured GRPO arm. Every arm of every configuration, and every probe of the search,
runs in its own process (this script re-invoked with --child). Arms: bench/_gpu_arms.py (stock TRL, slimrl),
bench/_gpu_unsloth.py (Unsloth); the peak reading: bench/_gpu_measure.py; the plan: bench/_gpu_plan.py.

    bash scripts/gpu_bench.sh --preset quick --out DIR              # a CUDA machine: GPU tier, then this script
    PYTHONPATH=src python bench/gpu_memory.py --preset quick --out DIR   # the bench alone
    PYTHONPATH=src python bench/gpu_memory.py --smoke --out DIR          # CPU, toy model, every code path
    python bench/gpu_memory.py --report DIR/gpu_memory.json ...           # one markdown table from several runs
                                                                          # (rows a run skipped for time left out,
                                                                          # each GRPO row planned again by this slimrl)

Presets (flags given on the command line win):
  quick  8B at 8 x 8192, then 1.5B at 8 x 8192, every GRPO arm, 2 steps each; no search (sized for one 10-minute
         command: what would not end before --deadline is skipped and said so)
  full   both models at 8 x 8192 and 8 x 2048 with every arm, 3 steps each; the longest completion of every arm on 8B;
         DPO/ORPO at 2 x 4096 (many 10-minute commands' worth: give a long --deadline, or split it with
         --only/--models/--arms into several commands and join their files with --report)
Output (--out): gpu_memory.json (every row as it comes, with the commit, device and versions), gpu_memory.md (the
tables), logs/ (each child's stdout and stderr). A killed command keeps the rows it finished; no child starts that
would not end before --deadline.

Choices:
* The peak is the whole run's, read the same way in every arm and reset by no one (bench/_gpu_measure.py).
* Ratios are against the stock arm of the same (model, length, rows); "best stock" is the best of stock,
  stock-offload and stock-ga8. The targets table checks slimrl's stated GPU targets (docs/gpu-and-benchmarks.md)
  for the slimrl arm.
* Longest completion: galloping search then bisection on multiples of --resolution, one step per probe in a fresh
  process (bench/_gpu_search.py); out-of-memory and other errors are told apart. --guess-from: GRPO rows at two or
  more lengths give the first probe.
* PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in every arm (unless set): the same allocator everywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, run_self, write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("grpo", "bisect", "pref")
GRPO_ARMS = ["stock", "stock-offload", "stock-ga8", "slimrl", "slimrl-offload", "unsloth"]
PRESETS = {
    "quick": dict(only=["grpo"], models=["8b", "1.5b"], lengths=[8192], arms=GRPO_ARMS, steps=2),
    "full": dict(
        only=list(PARTS), models=["8b", "1.5b"], lengths=[8192, 2048], arms=GRPO_ARMS, steps=3, bisect_models=["8b"]
    ),
    "smoke": dict(
        only=list(PARTS),
        models=["smoke"],
        lengths=[16],
        arms=["stock", "stock-ga8", "slimrl", "slimrl-offload"],
        steps=2,
        pref_length=64,
        start=16,
        resolution=16,
        maximum=16,
        device="cpu",
        threads=1,
        deadline=3600,
    ),
}
PREF_ARMS = ("stock", "slimrl", "slimrl-offload")


class Clock:
    """The command's time limit: a child starts only if the last child's duration still fits before the deadline."""

    def __init__(self, seconds: float):
        self.end, self.last = time.monotonic() + seconds, 0.0

    def run(self, args: list[str], threads: int, timeout: float, **child) -> dict | None:
        left = self.end - time.monotonic()
        if left < max(self.last, 30.0):
            return None
        began = time.monotonic()
        try:
            out = run_self(args, threads, timeout=min(timeout, left), **child)
        except subprocess.TimeoutExpired:
            out = {"error": f"timeout after {min(timeout, left):.0f} s"}
        self.last = time.monotonic() - began
        return out


SKIPPED = {"error": "skipped: no time left before --deadline"}


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("SLIMRL_COMMIT", "unknown")


def meta(a) -> dict:
    return {
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "host": os.uname().nodename,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "unsloth_site": a.unsloth_site,
    }


class Runner:
    """Runs the children of one command, annotates GRPO rows with the plan, saves every row as it comes."""

    def __init__(self, a):
        self.a, self.rows, self.clock, self.children = a, [], Clock(a.deadline), 0
        self.meta = meta(a)
        self.common = ["--threads", str(a.threads), "--device", a.device]

    def child(self, kind: str, arm: str, model: str, length: int, steps: int, rows: int, **extra) -> dict:
        args = ["--child", kind, "--arm", arm, "--model", model, "--length", str(length), "--rows", str(rows)]
        args += ["--steps", str(steps), *self.common] + [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
        self.children += 1
        name = f"{self.children:03d}-{kind}-{model}-{length}-{arm}.log"
        child = {"log": os.path.join(self.a.out, "logs", name)}
        if arm == "unsloth":
            if not self.a.unsloth_site:
                return {"error": "skipped: no Unsloth environment (--unsloth-site, scripts/unsloth_wheels.sh)"}
            from _gpu_unsloth import write_model_folder

            folder = write_model_folder(model, os.path.join(self.a.model_dir, f"unsloth-{model}"))
            args = ["--child", "unsloth", *args[2:], f"--model-folder={folder}"]
            inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
            child["pythonpath"] = [self.a.unsloth_site, *(p for p in inherited if p != os.path.join(ROOT, "src"))]
        return self.clock.run(args, self.a.threads, self.a.timeout, **child) or SKIPPED

    def add(self, row: dict) -> dict:
        self.rows.append(with_plan(row))
        save(self.rows, self.meta, self.a.out, self.a.json)
        shown = {k: v for k, v in row.items() if k not in ("probes", "planned_terms", "step_times", "settings")}
        print(json.dumps(shown)[:700], file=sys.stderr, flush=True)
        return row


def with_plan(row: dict) -> dict:
    """A measured GRPO row with this slimrl's plan for what it ran (bench/_gpu_plan.py) beside it."""
    if row.get("kind") == "grpo" and "error" not in row:
        from _gpu_plan import planned

        try:
            row.update(planned(row, row.get("device_total")))
        except Exception as exc:  # noqa: BLE001 - a plan that fails is reported, the measurement kept
            row["planned_error"] = f"{type(exc).__name__}: {exc}"
    return row


def save(rows: list[dict], run_meta: dict, out: str, also: str | None = None) -> None:
    os.makedirs(out, exist_ok=True)
    for path in [os.path.join(out, "gpu_memory.json")] + ([also] if also else []):
        write_results(path, {"meta": run_meta, "rows": rows})


def run_grpo(r: Runner, model: str) -> None:
    for length in r.a.lengths:
        for arm in r.a.arms:
            base = {"kind": "grpo", "arm": arm, "model": model, "length": length, "rows": r.a.rows}
            r.add({**base, "rollouts": "synthetic", **r.child("grpo", arm, model, length, r.a.steps, r.a.rows)})


def run_bisect(r: Runner, model: str, known: list[dict]) -> None:
    from _gpu_search import guess_longest, longest_fit

    for arm in r.a.arms:
        outcomes: dict[int, dict] = {}

        def probe(length: int, arm=arm, outcomes=outcomes) -> bool | None:
            out = r.child("grpo", arm, model, length, 1, r.a.rows)
            if out is SKIPPED:
                return None
            outcomes[length] = out
            r.add({**out, "kind": "probe", "arm": arm, "model": model, "length": length})
            return not out.get("oom") and "error" not in out

        guess = guess_longest(known + r.rows, model, arm, r.a.resolution)
        start = min(guess or r.a.start, r.a.maximum)
        found = longest_fit(probe, start, r.a.resolution, r.a.maximum, step=r.a.resolution if guess else None)
        failure = outcomes.get(found["first_failure"], {})
        reason = "OOM" if failure.get("oom") else failure.get("error", "")[:200] or None
        env = next((o for o in outcomes.values() if "device" in o), {})
        row = {"kind": "bisect", "arm": arm, "model": model, "rows": r.a.rows, "guess": guess, **found}
        r.add(dict(row, failure_reason=reason, **{k: env.get(k) for k in ("device", "torch", "transformers", "trl")}))


def run_pref(r: Runner, model: str) -> None:
    for trainer in r.a.pref_trainers:
        for arm in [arm for arm in r.a.arms if arm in PREF_ARMS]:
            base = {"kind": "pref", "arm": arm, "trainer": trainer, "model": model, "length": r.a.pref_length}
            out = r.child("pref", arm, model, r.a.pref_length, r.a.steps, r.a.pref_pairs, trainer=trainer)
            r.add({**base, "rows": r.a.pref_pairs, **out})


def run_parts(a) -> Runner:
    r = Runner(a)
    known = [row for path in a.guess_from for row in json.load(open(path))["rows"]]
    for model in a.models:
        if "grpo" in a.only:
            run_grpo(r, model)
        if "bisect" in a.only and model in (a.bisect_models or a.models):
            run_bisect(r, model, known)
        if "pref" in a.only:
            run_pref(r, model)
    return r


def child_main(a) -> dict:
    pin_threads(a.threads)
    if a.child == "unsloth":
        from _gpu_unsloth import child_unsloth

        return child_unsloth(a.model, a.length, a.rows, a.steps, a.model_folder, a.device)
    from _gpu_arms import child_grpo, child_preference

    if a.child == "grpo":
        return child_grpo(a.arm, a.model, a.length, a.rows, a.steps, a.rollouts, a.device)
    return child_preference(a.arm, a.trainer, a.model, a.length, a.rows, a.steps, a.device)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a set of the flags below (flags given win)")
    p.add_argument("--smoke", action="store_true", help="--preset smoke: CPU, toy model, every code path")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--models", nargs="+", default=["8b", "1.5b"], help="8b, 1.5b (smoke: the CPU toy)")
    p.add_argument("--arms", nargs="+", default=GRPO_ARMS, help=", ".join(GRPO_ARMS))
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 2048], help="GRPO completion tokens")
    p.add_argument("--rows", type=int, default=8, help="GRPO completions per optimizer step (one prompt, G = rows)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps; s/step is the mean after the first")
    p.add_argument("--rollouts", choices=["synthetic", "generate"], default="synthetic", help=argparse.SUPPRESS)
    p.add_argument("--bisect-models", nargs="+", help="models the longest-fit search runs on (default: --models)")
    p.add_argument("--start", type=int, default=16384, help="first probe of the search without a guess")
    p.add_argument("--resolution", type=int, default=2048)
    p.add_argument("--maximum", type=int, default=262144)
    p.add_argument("--guess-from", nargs="*", default=[], help="JSON files with GRPO rows at two or more lengths")
    p.add_argument("--pref-trainers", nargs="+", default=["dpo", "orpo"])
    p.add_argument("--pref-length", type=int, default=4096, help="DPO/ORPO tokens per row (prompt + answer)")
    p.add_argument("--pref-pairs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900, help="seconds one child may run")
    p.add_argument("--deadline", type=float, default=570, help="seconds this command may run in all")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpu_memory"), help="results folder")
    p.add_argument("--json", help="also write the results file here (with --report: the joined rows)")
    p.add_argument("--unsloth-site", default=os.environ.get("UNSLOTH_SITE"), help="Unsloth's own package folder")
    p.add_argument("--model-dir", default="/tmp/slimrl-bench-models", help="model folders the Unsloth arm loads")
    p.add_argument("--report", nargs="+", help="print the tables of these JSON files and exit")
    for hidden in ("--child", "--arm", "--model", "--trainer", "--model-folder"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    return p


def parse(argv=None) -> argparse.Namespace:
    """The flags, with the preset's values where a flag was not given on the command line."""
    a = parser().parse_args(argv)
    preset = "smoke" if a.smoke else a.preset
    if preset:
        bare = parser()
        for action in bare._actions:
            action.default = argparse.SUPPRESS
        given = set(vars(bare.parse_args(argv)))
        for key, value in PRESETS[preset].items():
            if key not in given:
                setattr(a, key, value)
    a.preset = preset
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.child:
        print(json.dumps(child_main(a)), flush=True)
        return 0
    sys.path.insert(1, os.path.join(ROOT, "src"))  # the parent plans with this slimrl (children: run_self's path)
    from _gpu_report import render

    if a.report:
        files = {path: json.load(open(path)) for path in a.report}
        rows = [row for f in files.values() for row in f["rows"] if not str(row.get("error", "")).startswith("skipped")]
        rows = [with_plan(row) for row in rows]  # planned again by this slimrl: the plan is arithmetic on the shapes
        print(render(rows, [f.get("meta", {}) for f in files.values()]))
        inputs = {path: f.get("provenance") for path, f in files.items()}
        write_results(a.json or results_path("gpu_memory_report"), {"inputs": inputs, "rows": rows})
        return 0
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    runner = run_parts(a)
    text = render(runner.rows, [runner.meta])
    with open(os.path.join(a.out, "gpu_memory.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
