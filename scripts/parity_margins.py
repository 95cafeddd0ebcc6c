"""Summarise the parity checks recorded with SLIMRL_PARITY_REPORT=path (tests/patches/_parity.py).

    SLIMRL_PARITY_REPORT=/tmp/parity.jsonl python3 -m pytest tests/patches tests/ops
    python3 scripts/parity_margins.py /tmp/parity.jsonl [more.jsonl ...]

Prints, per kind of compared quantity (loss, grad, param, metric, input, output, logged), the number of checks, the
largest e_patched / bound (the margin: must stay below 1), the largest e_patched / e_stock, and the check where the
margin is tightest.
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


def summarise(paths: list[str]) -> list[tuple]:
    rows = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                rows[kind_of(rec["what"])].append(rec)
    table = []
    for kind, recs in sorted(rows.items()):
        worst = max(recs, key=lambda r: r["e_patched"] / r["bound"] if r["bound"] else 0.0)
        ratio = max((r["e_patched"] / r["e_stock"] for r in recs if r["e_stock"] > 0), default=0.0)
        table.append(
            (
                kind,
                len(recs),
                worst["e_patched"] / worst["bound"] if worst["bound"] else 0.0,
                ratio,
                f"{worst['test']} :: {worst['what']}",
            )
        )
    return table


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print("| kind | checks | max e_patched / bound | max e_patched / e_stock | tightest |")
    print("|---|---|---|---|---|")
    for kind, n, margin, ratio, where in summarise(argv):
        print(f"| {kind} | {n} | {margin:.3f} | {ratio:.2f} | {where} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
