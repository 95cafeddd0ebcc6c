"""Detection floor of every parity case: the smallest change of one weight of the patched model that fails the parity
rule (tests/patches/_parity.py), found by bisection.

    python3 scripts/parity_floor.py survey OUT [pytest args]   # three runs over the cases: delta 0, 1e-5, 2e-5
    python3 scripts/parity_floor.py bisect OUT [-k SUBSTRING]  # per case: bisect around the survey's prediction
    python3 scripts/parity_floor.py table OUT                  # markdown: floor, margin, detecting check per case

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
ATEN_CPU_CAPABILITY=default, ...) in the environment: every pytest process inherits them (default: one thread).
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
SURVEY_DELTAS = (0.0, 1e-5, 2e-5)
BRACKET = 1.11  # bisection stops when the failing and passing deltas are within 11%
MAX_ROUNDS = 12
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


def survey(out: Path, pytest_args: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for delta in SURVEY_DELTAS:
        print(f"survey at delta {delta:g} ...", flush=True)
        run_pytest(pytest_args or ["tests/patches", "tests/ops"], out / f"survey_{delta:g}.jsonl", delta)


def surveyed(out: Path) -> list[dict]:
    return [load(out / f"survey_{delta:g}.jsonl") for delta in SURVEY_DELTAS]


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


def table(out: Path) -> None:
    runs0, run1, run2 = surveyed(out)
    floors_path = out / "floors.json"
    floors = json.loads(floors_path.read_text()) if floors_path.exists() else {}
    print(
        f"| case | floor (bisected) | predicted | untampered e/bound | e/bound at {SURVEY_DELTAS[1]:g} | detected by |"
    )
    print("|---|---|---|---|---|---|")
    for case in sorted(runs0):
        margin, _ = worst(runs0[case]["checks"])
        name = case.split("tests/", 1)[-1]
        if not run1.get(case, {}).get("nudged"):
            print(f"| {name} | n/a: no trainer of its own to change | | {margin:.2f} | | |")
            continue
        checks = [runs0[case]["checks"], run1[case]["checks"], run2[case]["checks"]]
        guess, where = predicted_floor(checks, SURVEY_DELTAS[1])
        measured = floors.get(case)
        floor = f"{measured['floor']:.2e}" if measured else "-"
        detector = measured["detected_by"] if measured else where
        at_delta = nudged_margin(checks[0], checks[1])
        print(f"| {name} | {floor} | {guess:.2e} | {margin:.2f} | {at_delta:.2f} | {detector} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("survey", "bisect", "table"))
    parser.add_argument("out", type=Path)
    parser.add_argument("-k", dest="only", default=None, help="bisect only cases whose id contains this")
    args, rest = parser.parse_known_args(argv)
    if args.command == "survey":
        survey(args.out, rest)
    elif args.command == "bisect":
        run_bisect(args.out, args.only)
    else:
        table(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
