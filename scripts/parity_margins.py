"""Summarise the parity checks recorded with SLIMRL_PARITY_REPORT=path (tests/patches/_parity.py).

    SLIMRL_PARITY_REPORT=/tmp/parity.jsonl python3 -m pytest tests/patches tests/ops
    python3 scripts/parity_margins.py /tmp/parity.jsonl [more.jsonl ...]
    python3 scripts/parity_margins.py --by-test --json FILE /tmp/parity.jsonl   # a row per test; the results file

Prints, per kind of compared quantity (loss, grad, param, metric, input, output, logged), the number of checks, the
largest e_patched / bound (the margin: must stay below 1), the largest e_patched / e_stock, and the check where the
margin is tightest; then each negative control's largest e_patched / bound (must stay above 1: record the controls
with SLIMRL_PARITY_SURVEY=1, which records every check instead of stopping at the first failure) and the weakest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

CONTROL_CHECK = "control"  # a check a test makes of a deliberately wrong value (`control NAME`): must fail
KINDS = (
    ("loss", "loss"),
    ("grad", "gradient"),
    ("param", "parameter"),
    ("metric", "metric"),
    ("logged", "metric"),
    ("input", "input (old/ref log-probs)"),
    ("final", "parameter"),
    ("control", CONTROL_CHECK),
)


def kind_of(what: str) -> str:
    tail = what.split(": ")[-1] if ": " in what else what
    return next(
        (kind for key, kind in KINDS if key in tail.split(" ")[0] or tail.startswith("final " + key)), "op output"
    )


def is_control(test: str) -> bool:
    """Whether a test is a negative control, by its name: `..._fail(s)`, `..._fail(s)_...`, `test_control_...`,
    `..._negative_control...`."""
    name = test.split("::")[-1].split("[")[0]
    failing = name.endswith(("_fail", "_fails")) or "_fail_" in name or "_fails_" in name
    return failing or name.startswith("test_control_") or "negative_control" in name


def records(paths: list[str]):
    """Every recorded check (not the nudge notes of scripts/parity_floor.py)."""
    for path in paths:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if rec["what"] != "nudge":
                    yield rec


def margin(rec: dict) -> float:
    if rec.get("exact"):
        return float("inf")
    return rec["e_patched"] / rec["bound"] if rec["bound"] else 0.0


def controls(paths: list[str]) -> dict[str, float]:
    """Each negative control's largest e_patched / bound."""
    worst: dict[str, float] = {}
    for rec in records(paths):
        if is_control(rec["test"]):
            worst[rec["test"]] = max(worst.get(rec["test"], 0.0), margin(rec))
    return worst


def summarise(paths: list[str]) -> list[tuple]:
    rows = defaultdict(list)
    for rec in records(paths):
        if not is_control(rec["test"]) and kind_of(rec["what"]) != CONTROL_CHECK:
            rows[kind_of(rec["what"])].append(rec)
    table = []
    for kind, recs in sorted(rows.items()):
        worst = max(recs, key=margin)
        ratio = max((r["e_patched"] / r["e_stock"] for r in recs if r["e_stock"] > 0), default=0.0)
        table.append(
            (
                kind,
                len(recs),
                margin(worst),
                ratio,
                f"{worst['test']} :: {worst['what']}",
            )
        )
    return table


def kinds_data(kinds: list[tuple]) -> list[dict]:
    """summarise()'s rows as the results file holds them."""
    fields = ("kind", "checks", "max_e_over_bound", "max_e_over_e_stock", "tightest")
    return [dict(zip(fields, kind)) for kind in kinds]


def print_tables(kinds: list[tuple], worst: dict[str, float]) -> None:
    print("| kind | checks | max e_patched / bound | max e_patched / e_stock | tightest |")
    print("|---|---|---|---|---|")
    for kind, n, tightest, ratio, where in kinds:
        print(f"| {kind} | {n} | {tightest:.3f} | {ratio:.2f} | {where} |")
    if worst:
        print("\n| negative control | largest e_patched / bound |\n|---|---|")
        for test, value in sorted(worst.items(), key=lambda item: item[1]):
            print(f"| {test} | {value:.2f} |")
        print(f"\nweakest negative control: {min(worst.values()):.2f}")


def by_test(paths: list[str]) -> list[dict]:
    """Per test (negative-control tests left out): its number of checks, its largest e_patched / bound per kind (its
    own control checks: the smallest, which must stay above 1), and its largest loss error (e_patched of a check of
    a loss: the distance from the reference)."""
    tests: dict[str, dict] = defaultdict(lambda: {"checks": 0, "margins": {}, "largest_loss_error": 0.0})
    for rec in records(paths):
        if is_control(rec["test"]):
            continue
        row, kind = tests[rec["test"]], kind_of(rec["what"])
        row["checks"] += 1
        pick = min if kind == CONTROL_CHECK else max
        row["margins"][kind] = pick(row["margins"].get(kind, margin(rec)), margin(rec))
        if "loss" in rec["what"]:
            row["largest_loss_error"] = max(row["largest_loss_error"], rec["e_patched"])
    return [{"test": test, **row} for test, row in sorted(tests.items())]


def print_by_test(rows: list[dict]) -> None:
    kinds = sorted({kind for row in rows for kind in row["margins"]})
    print(f"| test | checks | {' | '.join(kinds)} | largest loss error |")
    print("|---|---|" + "---|" * len(kinds) + "---|")
    for row in rows:
        cells = [f"{row['margins'][k]:.3f}" if k in row["margins"] else "n/a" for k in kinds]
        print(f"| {row['test']} | {row['checks']} | {' | '.join(cells)} | {row['largest_loss_error']:.1e} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--by-test", action="store_true", help="a row per test instead of per kind")
    parser.add_argument("--json", default=None, help="the results file (bench/_common.py's write_results)")
    args = parser.parse_args(argv)
    if args.json:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from bench._common import keep_stdout

        keep_stdout()
    data: dict = {"controls": controls(args.reports)}
    if args.by_test:
        data["tests"] = by_test(args.reports)
        print_by_test(data["tests"])
        worst = data["controls"]
        if worst:
            print(f"\nnegative controls: {len(worst)}, the weakest at {min(worst.values()):.2f}")
    else:
        kinds = summarise(args.reports)
        data["kinds"] = kinds_data(kinds)
        print_tables(kinds, data["controls"])
    if args.json:
        from bench._common import write_results

        write_results(args.json, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
