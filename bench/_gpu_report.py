"""Markdown tables of bench/gpu_memory.py's rows: GRPO, the longest completion that fits, DPO/ORPO, and the
targets with the measured ratios. Pure functions of the rows (the JSON files), so runs from several commands join
into one report."""

from __future__ import annotations

from _common import GiB

ARM_ORDER = ("stock", "stock-offload", "slimrl", "slimrl-offload")
TARGETS = {"peak": 0.5, "time": 1.05, "longest": 3.0}
TARGET_MODEL, TARGET_LENGTH, TARGET_ARM = "8b", 8192, "slimrl-offload"


def _table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])


def _gib(value) -> str:
    return "n/a" if value is None else f"{value / GiB:.2f}"


def _status(row: dict) -> str | None:
    if row.get("oom"):
        return "OOM"
    if "error" in row:
        return "error: " + row["error"].strip().splitlines()[-1][:80]
    return None


def _ratio(row: dict, stock: dict | None, key: str) -> str:
    if stock is None or _status(row) or _status(stock) or not stock.get(key):
        return "n/a"
    return f"{row[key] / stock[key]:.2f}"


def _group_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("kind", "model", "trainer", "length", "rows", "rollouts"))


def _stock_of(rows: list[dict], row: dict) -> dict | None:
    return next((r for r in rows if r["arm"] == "stock" and _group_key(r) == _group_key(row)), None)


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (str(_group_key(r)), ARM_ORDER.index(r["arm"]) if r["arm"] in ARM_ORDER else 9))


def _run_lines(rows: list[dict], label) -> list[list[str]]:
    lines = []
    for row in _sorted(rows):
        stock, status = _stock_of(rows, row), _status(row)
        loss = f"{row['losses'][-1]:.4g}" if row.get("losses") else "n/a"
        cells = [_gib(row.get("peak")), _gib(row.get("reserved"))]
        cells += (
            [status] * 3
            if status
            else [f"{row['s_per_step']:.2f}", _ratio(row, stock, "peak"), _ratio(row, stock, "s_per_step")]
        )
        lines.append([*label(row), row["arm"], *cells, loss])
    return lines


def grpo_table(rows: list[dict]) -> str:
    head = [
        "model",
        "completion",
        "rollouts",
        "arm",
        "peak GiB",
        "reserved GiB",
        "s/step",
        "peak ratio",
        "time ratio",
        "last loss",
    ]
    return _table(head, _run_lines(rows, lambda r: [r["model"], f"{r['rows']} x {r['length']}", r["rollouts"]]))


def pref_table(rows: list[dict]) -> str:
    head = [
        "model",
        "trainer",
        "tokens",
        "arm",
        "peak GiB",
        "reserved GiB",
        "s/step",
        "peak ratio",
        "time ratio",
        "last loss",
    ]
    return _table(head, _run_lines(rows, lambda r: [r["model"], r["trainer"], f"{r['rows']} x {r['length']}"]))


def _longest(row: dict) -> str:
    stopped = " (search stopped by the deadline)" if row.get("stopped") else ""
    if row["longest"] is None:
        return "none" + stopped
    if row["first_failure"] is None:
        return f">= {row['longest']} (largest probed){stopped}"
    return str(row["longest"]) + stopped


def bisect_table(rows: list[dict]) -> str:
    head = ["model", "arm", "longest completion that fits", "first failure", "ratio vs stock", "probes"]
    lines = []
    for row in _sorted(rows):
        stock = _stock_of(rows, row)
        ratio = "n/a"
        if stock and stock["longest"] and row["longest"] is not None:
            ratio = f"{row['longest'] / stock['longest']:.2f}" + (" (lower bound)" if not row["first_failure"] else "")
        failure = "none" if row["first_failure"] is None else f"{row['first_failure']} ({row['failure_reason']})"
        probes = ", ".join(f"{n}{'' if ok else 'x'}" for n, ok in row["probes"])
        lines.append([row["model"], row["arm"], _longest(row), failure, ratio, probes])
    return _table(head, lines)


def targets_table(rows: list[dict]) -> str:
    def find(kind, arm, **kw):
        return next(
            (
                r
                for r in rows
                if r["kind"] == kind
                and r["arm"] == arm
                and r["model"] == TARGET_MODEL
                and all(r.get(k) == v for k, v in kw.items())
            ),
            None,
        )

    run, stock = find("grpo", TARGET_ARM, length=TARGET_LENGTH), find("grpo", "stock", length=TARGET_LENGTH)
    fit, stock_fit = find("bisect", TARGET_ARM), find("bisect", "stock")
    measured = {
        "peak": _ratio(run, stock, "peak") if run else "n/a",
        "time": _ratio(run, stock, "s_per_step") if run else "n/a",
        "longest": "n/a",
    }
    if fit and stock_fit and fit["longest"] and stock_fit["longest"]:
        measured["longest"] = f"{fit['longest'] / stock_fit['longest']:.2f}"
    names = {
        "peak": "GRPO peak <= 0.5x stock (8B-class, 8 x 8K, offload on)",
        "time": "GRPO s/step <= 1.05x stock (same run)",
        "longest": "longest completion that fits >= 3x stock's (8B-class, offload on)",
    }
    lines = []
    for key, bound in TARGETS.items():
        value = measured[key]
        met = (
            "not measured"
            if value == "n/a"
            else ("met" if (float(value) >= bound if key == "longest" else float(value) <= bound) else "NOT met")
        )
        lines.append([names[key], value, met])
    return _table(["target", "measured ratio", "verdict"], lines)


def render(rows: list[dict]) -> str:
    envs = sorted(
        {(r.get("device"), r.get("torch"), r.get("transformers"), r.get("trl")) for r in rows if r.get("device")},
        key=str,
    )
    header = [
        "# slimrl vs stock TRL on "
        + ("; ".join(f"{d} (torch {t}, transformers {tf}, trl {trl})" for d, t, tf, trl in envs) or "an unknown device")
    ]
    parts = [
        ("GRPO, LoRA r=16, bf16 (fp32 on CPU), gradient checkpointing", "grpo", grpo_table),
        ("Longest GRPO completion that fits (8 rows, one step, synthetic rollouts)", "bisect", bisect_table),
        ("DPO / ORPO, LoRA r=16, bf16 (fp32 on CPU), gradient checkpointing", "pref", pref_table),
    ]
    for title, kind, table in parts:
        selected = [r for r in rows if r.get("kind") == kind]
        if selected:
            header += ["", f"## {title}", "", table(selected)]
    return "\n".join(header + ["", "## Targets", "", targets_table(rows)])
