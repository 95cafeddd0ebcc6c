"""Detection floor of every parity case: the smallest change of one weight of the patched model that fails the parity
rule (tests/patches/_parity.py), found by bisection.

    python3 scripts/parity_floor.py survey OUT [pytest args]   # three runs over the cases: delta 0, 1e-5, 2e-5
    python3 scripts/parity_floor.py bisect OUT [-k SUBSTRING]  # per case: bisect around the survey's prediction
    python3 scripts/parity_floor.py table OUT                  # markdown: floor, margin, detecting check per case
    python3 scripts/parity_floor.py report OUT --json FILE     # the tables of docs/parity.md, and its results file

`survey OUT tests/patches tests/ops --deltas 0 1e-5` (the pytest arguments first) runs only those changes (enough
for `report`'s margins and detection at 1e-5; the prediction needs all three).

The weight is element [0, 0] of the first decoder layer's MLP up-projection of the patched side's policy
(`_parity.nudge_one_weight`, applied when SLIMRL_PARITY_NUDGE is set); the other five sides are untouched. Runs record
every check (SLIMRL_PARITY_SURVEY=1: a failing check is recorded, not raised), so one run measures all of a case's
checks. `survey` (default pytest args: tests/patches tests/ops) predicts each case's floor: the patched error of a
check is |a + t b| for a change t x delta, and its squares at t = 0, 1, 2 give |a|^2, a.b and |b|^2, so the smallest t
where some check reaches its bound follows from a quadratic per check. `bisect` then measures: starting 5% above the
prediction it brackets each case's floor between a passing and a failing delta and halves the bracket in log space
until its ends are within `BRACKET`. It runs in rounds: one pytest process per round runs every unfinished case,
each at its own delta (SLIMRL_PARITY_NUDGE={test id: delta}). Cases whose checks the nudge cannot reach (two functions
compared on one model: tests/ops, the seam called directly) are listed with that reason.

Set OMP_NUM_THREADS and the emulation variables (MKL_ENABLE_INSTRUCTIONS=AVX2, MKL_CBWR=COMPATIBLE,
ATEN_CPU_CAPABILITY=default, LD_PRELOAD of scripts/mkl_intel_path.c built, ...) in the environment: every pytest
process inherits them (default: one thread).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import parity_margins  # noqa: E402

SURVEY_DELTAS = (0.0, 1e-5, 2e-5)
BRACKET = 1.11  # bisection stops when the failing and passing deltas are within 11%
MAX_ROUNDS = 12
# the settings that emulate other CPUs (docs/parity.md, "Margins on other CPUs"), recorded in a report's results file
# (LD_PRELOAD: scripts/mkl_intel_path.c built, MKL's Intel path on any x86 CPU; recorded by file name)
ENV_SETTINGS = (
    "OMP_NUM_THREADS",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "ATEN_CPU_CAPABILITY",
    "LD_PRELOAD",
)
GUESS_RANGE = (1e-7, 1e-3)  # a prediction outside (a discrete metric flipping) starts the bracket at its edge


def run_pytest(args: list[str], report: Path, delta) -> int:
    """pytest on `args` with every check recorded to `report` (survey mode) and the patched weight changed by `delta`
    (a number, or {test id: delta})."""
    report.unlink(missing_ok=True)
    env = dict(os.environ, SLIMRL_PARITY_REPORT=str(report), SLIMRL_PARITY_SURVEY="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("SLIMRL_PARITY_NUDGE", None)
    if delta:
        env["SLIMRL_PARITY_NUDGE"] = json.dumps(delta) if isinstance(delta, dict) else repr(delta)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def load(report: Path) -> dict[str, dict]:
    """Per test: its checks keyed by (what, occurrence) and whether the nudge reached its patched model."""
    cases: dict[str, dict] = defaultdict(lambda: {"checks": {}, "nudged": False})
    seen: dict[tuple, int] = defaultdict(int)
    for line in report.read_text().splitlines():
        rec = json.loads(line)
        case = cases[rec["test"]]
        if rec["what"] == "nudge":
            case["nudged"] = True
            continue
        seen[rec["test"], rec["what"]] += 1
        case["checks"][rec["what"], seen[rec["test"], rec["what"]]] = rec
    return dict(cases)


def ratio(rec: dict) -> float:
    if rec.get("exact"):
        return math.inf
    return rec["e_patched"] / rec["bound"] if rec["bound"] > 0 else (0.0 if rec["e_patched"] == 0 else math.inf)


def worst(checks: dict) -> tuple[float, str]:
    """The largest e_patched / bound of a run and its check."""
    return max(((ratio(rec), key[0]) for key, rec in checks.items()), default=(0.0, ""))


def nudged_margin(untampered: dict, nudged: dict) -> float:
    """The largest e_patched / bound of a nudged run, each bound taken from the untampered run (the nudge changes only
    the patched side, so the bound is the same)."""
    ratios = (ratio({**rec, "bound": untampered[key]["bound"]}) for key, rec in nudged.items() if key in untampered)
    return max(ratios, default=0.0)


def predicted_floor(runs: list[dict], delta: float) -> tuple[float, str]:
    """Smallest t x delta at which a check reaches its bound, from runs at t = 0, 1, 2 (module docstring)."""
    best, where = math.inf, ""
    for key, rec0 in runs[0].items():
        if any(key not in run for run in runs[1:]):
            continue
        a2, e1, e2 = (run[key]["e_patched"] ** 2 for run in runs)
        b2 = (e2 - 2 * e1 + a2) / 2
        ab = (e1 - a2 - b2) / 2
        bound2 = rec0["bound"] ** 2
        disc = ab * ab - b2 * (a2 - bound2)
        if b2 <= 0 or disc < 0:
            continue
        t = (-ab + math.sqrt(disc)) / b2
        if 0 < t * delta < best:
            best, where = t * delta, key[0]
    return best, where


def survey(out: Path, pytest_args: list[str], deltas=SURVEY_DELTAS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for delta in deltas:
        print(f"survey at delta {delta:g} ...", flush=True)
        run_pytest(pytest_args or ["tests/patches", "tests/ops"], out / f"survey_{delta:g}.jsonl", delta)


def surveyed(out: Path) -> list[dict]:
    """The survey's runs, at each of SURVEY_DELTAS; an empty dict for a change not run."""
    paths = [out / f"survey_{delta:g}.jsonl" for delta in SURVEY_DELTAS]
    return [load(path) if path.exists() else {} for path in paths]


def next_delta(state: dict) -> float | None:
    """The delta to try next for one case (None: bracketed to BRACKET)."""
    lo, hi = state["passes_at"], state["floor"]
    if hi is None:
        return state["guess"] * 1.05 if lo is None else lo * 4
    if lo is None:
        return hi / 1.1 if hi == state["guess"] * 1.05 else hi / 4
    return math.sqrt(lo * hi) if hi / lo > BRACKET else None


def bisect_round(out: Path, states: dict[str, dict], round_no: int) -> None:
    """One pytest process: every unfinished case at its next delta; updates the states."""
    deltas = {case: next_delta(state) for case, state in states.items()}
    deltas = {case: delta for case, delta in deltas.items() if delta is not None}
    if not deltas:
        return
    report = out / f"bisect_round_{round_no}.jsonl"
    run_pytest(sorted(deltas), report, deltas)
    measured = load(report) if report.exists() else {}
    for case, delta in deltas.items():
        margin, what = worst(measured.get(case, {"checks": {}})["checks"])
        state = states[case]
        state["runs"].append((delta, margin, what))
        if margin > 1.0:
            state["floor"], state["detected_by"] = delta, what
        else:
            state["passes_at"] = delta


def run_bisect(out: Path, only: str | None) -> None:
    runs0, *nudged = surveyed(out)
    floors_path = out / "floors.json"
    floors = json.loads(floors_path.read_text()) if floors_path.exists() else {}
    states = {}
    for case in runs0:
        if (only and only not in case) or case in floors or not nudged[0].get(case, {}).get("nudged"):
            continue
        guess, _ = predicted_floor([runs0[case]["checks"], *(n[case]["checks"] for n in nudged)], SURVEY_DELTAS[1])
        guess = min(max(guess, GUESS_RANGE[0]), GUESS_RANGE[1])
        states[case] = {"guess": guess, "floor": None, "passes_at": None, "detected_by": "", "runs": []}
    for round_no in range(MAX_ROUNDS):
        print(f"round {round_no}: {sum(next_delta(s) is not None for s in states.values())} cases", flush=True)
        bisect_round(out, states, round_no)
        floors.update({case: state for case, state in states.items() if next_delta(state) is None})
        floors_path.write_text(json.dumps(floors, indent=1))


def case_rows(out: Path) -> list[dict]:
    """Per case: its untampered margin and, where the change reaches a trainer, its margin at SURVEY_DELTAS[1], its
    predicted floor (when the survey ran every change) and its bisected floor (when `bisect` ran)."""
    runs0, run1, run2 = surveyed(out)
    floors_path = out / "floors.json"
    floors = json.loads(floors_path.read_text()) if floors_path.exists() else {}
    rows = []
    for case in sorted(runs0):
        row = {"case": case.split("tests/", 1)[-1], "untampered": worst(runs0[case]["checks"])[0]}
        if run1.get(case, {}).get("nudged"):
            checks = [runs0[case]["checks"], run1[case]["checks"], run2.get(case, {}).get("checks", {})]
            row["at_delta"] = nudged_margin(checks[0], checks[1])
            row["predicted"], row["detected_by"] = predicted_floor(checks, SURVEY_DELTAS[1]) if run2 else (None, "")
            if case in floors:
                row["floor"], row["detected_by"] = floors[case]["floor"], floors[case]["detected_by"]
        rows.append(row)
    return rows


def _e(value) -> str:
    return "-" if value is None else f"{value:.2e}"


def table(out: Path) -> list[dict]:
    rows = case_rows(out)
    columns = f"floor, bisected | floor, predicted | untampered e/bound | e/bound at {SURVEY_DELTAS[1]:g}"
    print(f"| case | {columns} | detected by |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "at_delta" not in row:
            print(f"| {row['case']} | n/a: no trainer of its own to change | | {row['untampered']:.2f} | | |")
            continue
        cells = [_e(row.get("floor")), _e(row["predicted"]), f"{row['untampered']:.2f}", f"{row['at_delta']:.2f}"]
        print(f"| {row['case']} | {' | '.join(cells)} | {row['detected_by']} |")
    return rows


def report(out: Path, json_path: str | None) -> None:
    """The margins row (parity_margins over the untampered run), the negative controls, the detection at
    SURVEY_DELTAS[1], then the cases' table; with --json, the results file of all of it."""
    untampered = [str(out / "survey_0.jsonl")]
    kinds = parity_margins.summarise(untampered)
    controls = parity_margins.controls(untampered)
    parity_margins.print_tables(kinds, controls)
    rows = [row for row in table(out) if not parity_margins.is_control(row["case"])]
    reached = [row["at_delta"] for row in rows if "at_delta" in row]
    detection = min(reached, default=None)
    print(f"\ndetection at {SURVEY_DELTAS[1]:g}: smallest e/bound {detection:.2f} over {len(reached)} cases")
    if json_path:
        from bench._common import write_results

        env = {name: os.environ.get(name) for name in ENV_SETTINGS}
        env["LD_PRELOAD"] = env["LD_PRELOAD"] and os.path.basename(env["LD_PRELOAD"])
        env["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"] or "1"  # run_pytest's default
        data = {"environment": env, "kinds": parity_margins.kinds_data(kinds), "controls": controls}
        data["detection_at_delta"] = {"delta": SURVEY_DELTAS[1], "smallest_e_over_bound": detection}
        data |= {"cases_at_delta": len(reached), "cases": rows}
        write_results(json_path, data)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("survey", "bisect", "table", "report"))
    parser.add_argument("out", type=Path)
    parser.add_argument("-k", dest="only", default=None, help="bisect only cases whose id contains this")
    parser.add_argument("--deltas", type=float, nargs="+", default=list(SURVEY_DELTAS), help="survey: these changes")
    parser.add_argument("--json", default=None, help="report: the results file")
    args, rest = parser.parse_known_args(argv)
    if args.command == "survey":
        survey(args.out, rest, args.deltas)
    elif args.command == "bisect":
        run_bisect(args.out, args.only)
    elif args.command == "table":
        table(args.out)
    else:
        if args.json:
            from bench._common import keep_stdout

            keep_stdout()
        report(args.out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
