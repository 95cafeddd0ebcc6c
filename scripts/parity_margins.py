"""Summarise the parity checks recorded with SLIMRL_PARITY_REPORT=path (tests/patches/_parity.py).

    SLIMRL_PARITY_REPORT=/tmp/parity.jsonl python3 -m pytest tests/patches tests/ops
    python3 scripts/parity_margins.py /tmp/parity.jsonl [more.jsonl ...]

Prints, per kind of compared quantity (loss, grad, param, metric, input, output, logged), the number of checks, the
largest e_patched / bound (the margin: must stay below 1), the largest e_patched / e_stock, and the check where the
margin is tightest; then each negative control's largest e_patched / bound (must stay above 1: record the controls
with SLIMRL_PARITY_SURVEY=1, which records every check instead of stopping at the first failure) and the weakest.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

KINDS = (
    ("loss", "loss"),
    ("grad", "gradient"),
    ("param", "parameter"),
    ("metric", "metric"),
    ("logged", "metric"),
    ("input", "input (old/ref log-probs)"),
)


def kind_of(what: str) -> str:
    tail = what.split(": ")[-1] if ": " in what else what
    return next(
        (kind for key, kind in KINDS if key in tail.split(" ")[0] or tail.startswith("final " + key)), "op output"
    )


CONTROL_MARKS = ("_fails", "negative_control")  # the negative controls' test names


def is_control(test: str) -> bool:
    return any(mark in test.split("::")[-1] for mark in CONTROL_MARKS)


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
        if not is_control(rec["test"]):
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


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print_tables(summarise(argv), controls(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
