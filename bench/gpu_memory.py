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

Presets (flags given on the command line win; bench/_gpu_options.py):
  quick    8B at 8 x 8192, then 1.5B at 8 x 8192, every GRPO arm, 2 steps each; no search (sized for one 10-minute
           command: what would not end before --deadline is skipped and said so)
  speed    the speed arms (stock, stock-liger, stock-ga8, slimrl, unsloth, unsloth-ga8; then slimrl's levers one at a
           time: slimrl-no-speed-levers, slimrl-only-*) at 8B then 1.5B, 8 x 8192, 1 warm-up + 4 timed steps each,
           stock, slimrl-no-speed-levers and slimrl profiled (--profile); the lever arms run last (--lever-arms-last)
  longest  the longest 8-row completion of slimrl, stock-ga8 and Unsloth on 8B (bench/_gpu_longest.py), from slimrl's
           predicted length, to 4096 tokens, then slimrl's one-row probe at 262144
  full     both models at 8 x 8192 and 8 x 2048 with every arm, 3 steps each; the longest completion of the search
           arms (--bisect-arms) on 8B;
           DPO/ORPO at 2 x 4096 (many 10-minute commands' worth: give a long --deadline, or split it with
           --only/--models/--arms into several commands and join their files with --report)
Output (--out): gpu_memory.json (every row as it comes, with the commit, device and versions, and `profiles`: the
profiled steps' kernel time by category), gpu_memory.md (the tables), logs/ (each child's stdout and stderr). A
killed command keeps the rows it finished; no child starts that would not end before --deadline.

Choices:
* The peak is the whole run's, read the same way in every arm and reset by no one (bench/_gpu_measure.py).
* Ratios are against the stock arm of the same (model, length, rows); "best stock" is the best of stock,
  stock-offload and stock-ga8. The targets table checks slimrl's stated GPU targets (docs/gpu-and-benchmarks.md)
  for the slimrl arm.
* s/step: the median of the timed steps (every step but the first; a profiled step is one more, left out); every
  step's time is in the row (`step_times`).
* Arms that cannot run here (Liger or Unsloth without CUDA, no Unsloth environment, a lever this slimrl lacks) are
  rows with `skipped` and the reason, never left out.
* Longest completion (bench/_gpu_longest.py): the first probe is slimrl's prediction (made before any probe and
  kept in the row), then galloping steps and bisection on multiples of --resolution, one step per probe in a fresh
  process with a --timeout (bench/_gpu_search.py); out-of-memory and other errors are told apart. --guess-from: GRPO
  rows at two or more lengths give the first probe where there is no prediction.
* PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in every arm (unless set): the same allocator everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, run_self, write_results  # noqa: E402
from _gpu_options import GRPO_ARMS, LEVER_ARMS, PRESETS, parse  # noqa: E402, F401 (GRPO_ARMS, PRESETS: re-exported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
        self.a, self.rows, self.profiles, self.clock, self.children = a, [], [], Clock(a.deadline), 0
        self.meta = meta(a)
        self.common = ["--threads", str(a.threads), "--device", a.device]

    def skip_reason(self, arm: str) -> str | None:
        """Why `arm` cannot run in this command (None: it can)."""
        from _gpu_arms import NEEDS_CUDA

        if self.a.device != "cuda" and arm in NEEDS_CUDA:
            return f"{NEEDS_CUDA[arm]} (device {self.a.device})"
        if arm.startswith("unsloth") and not self.a.unsloth_site:
            return "no Unsloth environment (--unsloth-site, scripts/unsloth_wheels.sh)"
        return None

    def child(self, kind: str, arm: str, model: str, length: int, steps: int, rows: int, **extra) -> dict:
        skipped = self.skip_reason(arm)
        if skipped:
            return {"error": f"skipped: {skipped}", "skipped": skipped}
        args = ["--child", kind, "--arm", arm, "--model", model, "--length", str(length), "--rows", str(rows)]
        args += ["--steps", str(steps), *self.common] + [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
        self.children += 1
        name = f"{self.children:03d}-{kind}-{model}-{length}-{arm}.log"
        child = {"log": os.path.join(self.a.out, "logs", name)}
        if arm.startswith("unsloth"):
            from _gpu_unsloth import write_model_folder

            folder = write_model_folder(model, os.path.join(self.a.model_dir, f"unsloth-{model}"))
            args = ["--child", "unsloth", *args[2:], f"--model-folder={folder}"]
            inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
            child["pythonpath"] = [self.a.unsloth_site, *(p for p in inherited if p != os.path.join(ROOT, "src"))]
        return self.clock.run(args, self.a.threads, self.a.timeout, **child) or SKIPPED

    def add(self, row: dict) -> dict:
        profile = row.pop("profile", None)
        if profile:
            self.profiles.append({k: row.get(k) for k in ("arm", "model", "length", "rows", "device")} | profile)
        self.rows.append(with_plan(row))
        save(self.rows, self.meta, self.a.out, self.a.json, self.profiles)
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


def save(rows: list[dict], run_meta: dict, out: str, also: str | None = None, profiles: list | None = None) -> None:
    os.makedirs(out, exist_ok=True)
    for path in [os.path.join(out, "gpu_memory.json")] + ([also] if also else []):
        write_results(path, {"meta": run_meta, "rows": rows, "profiles": profiles or []})


def schedule(a, model: str | None) -> list[tuple[str, int, str]]:
    """(model, length, arm) to run: `model`'s (with --lever-arms-last: without LEVER_ARMS), or with None every
    model's LEVER_ARMS runs (with --lever-arms-last: after the rest, so what a --deadline cuts is the least needed)."""
    runs = [(m, length, arm) for m in a.models for length in a.lengths for arm in a.arms]
    if model is not None:
        return [run for run in runs if run[0] == model and not (a.lever_arms_last and run[2] in LEVER_ARMS)]
    return [run for run in runs if a.lever_arms_last and run[2] in LEVER_ARMS]


def run_grpo(r: Runner, runs: list[tuple[str, int, str]]) -> None:
    for model, length, arm in runs:
        base = {"kind": "grpo", "arm": arm, "model": model, "length": length, "rows": r.a.rows}
        extra = {"profile_step": 1} if arm in r.a.profile else {}
        r.add({**base, "rollouts": "synthetic", **r.child("grpo", arm, model, length, r.a.steps, r.a.rows, **extra)})


def run_pref(r: Runner, model: str) -> None:
    for trainer in r.a.pref_trainers:
        for arm in [arm for arm in r.a.arms if arm in PREF_ARMS]:
            base = {"kind": "pref", "arm": arm, "trainer": trainer, "model": model, "length": r.a.pref_length}
            out = r.child("pref", arm, model, r.a.pref_length, r.a.steps, r.a.pref_pairs, trainer=trainer)
            r.add({**base, "rows": r.a.pref_pairs, **out})


def run_parts(a) -> Runner:
    r = Runner(a)
    known = [row for path in a.guess_from for row in json.load(open(path))["rows"]]
    from _gpu_longest import run_search

    grpo = "grpo" in a.only
    for model in a.models:
        run_grpo(r, schedule(a, model) if grpo else [])
        if "bisect" in a.only and model in (a.bisect_models or a.models):
            run_search(r, model, known)
        if "pref" in a.only:
            run_pref(r, model)
    run_grpo(r, schedule(a, None) if grpo else [])
    return r


def child_main(a) -> dict:
    from _gpu_measure import ArmSkipped

    pin_threads(a.threads)
    try:
        return _child(a)
    except ArmSkipped as exc:
        return {"error": f"skipped: {exc}", "skipped": str(exc)}


def _child(a) -> dict:
    if a.child == "device":
        import torch

        name, total = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory
        return {"device": name, "device_total": total}
    if a.child == "unsloth":
        from _gpu_measure import profiler
        from _gpu_unsloth import child_unsloth

        hook, steps = profiler(bool(a.profile_step), a.steps, a.device), a.steps + int(bool(a.profile_step))
        return child_unsloth(a.model, a.length, a.rows, steps, a.model_folder, a.device, a.arm, hook)
    from _gpu_arms import child_grpo, child_preference

    if a.child == "grpo":
        profile = bool(a.profile_step)
        return child_grpo(a.arm, a.model, a.length, a.rows, a.steps, a.rollouts, a.device, profile, a.accumulation)
    return child_preference(a.arm, a.trainer, a.model, a.length, a.rows, a.steps, a.device)


def main(argv=None) -> int:
    a = parse(argv, __doc__)
    if a.child:
        print(json.dumps(child_main(a)), flush=True)
        return 0
    sys.path.insert(1, os.path.join(ROOT, "src"))  # the parent plans with this slimrl (children: run_self's path)
    from _gpu_report import render

    if a.report:
        files = {path: json.load(open(path)) for path in a.report}
        rows = [row for f in files.values() for row in f["rows"] if not str(row.get("error", "")).startswith("skipped")]
        rows = [with_plan(row) for row in rows]  # planned again by this slimrl: the plan is arithmetic on the shapes
        profiles = [p for f in files.values() for p in f.get("profiles", [])]
        print(render(rows, [f.get("meta", {}) for f in files.values()], profiles))
        inputs = {path: f.get("provenance") for path, f in files.items()}
        data = {"inputs": inputs, "rows": rows, "profiles": profiles}
        write_results(a.json or results_path("gpu_memory_report"), data)
        return 0
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    runner = run_parts(a)
    text = render(runner.rows, [runner.meta], runner.profiles)
    with open(os.path.join(a.out, "gpu_memory.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
