"""Markdown tables of bench/gpu_memory.py's rows: GRPO arms with the plan beside each, what Unsloth chose, the longest
completion that fits, DPO/ORPO, and the targets with their measured ratios. Pure functions of the rows (the JSON
files), so runs from several commands join into one report."""

from __future__ import annotations

from _common import GiB

ARM_ORDER = ("stock", "stock-liger", "stock-offload", "stock-ga8", "slimrl", "slimrl-offload", "slimrl-no-speed-levers")
ARM_ORDER += ("slimrl-only-cast-skip", "slimrl-only-fused-lora", "slimrl-only-liger", "unsloth", "unsloth-ga8")
STOCK_ARMS = ("stock", "stock-liger", "stock-offload", "stock-ga8")
TARGET_MODEL, TARGET_LENGTH, TARGET_ARM = "8b", 8192, "slimrl"
PLAN_TOLERANCE = 0.15
LONGEST_TOKENS = 200_000
LONGEST_8_ROWS, LONGEST_1_ROW = 131_072, 262_144


def _table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])


def _gib(value) -> str:
    return "n/a" if value is None else f"{value / GiB:.2f}"


def _status(row: dict | None) -> str | None:
    if row is None:
        return "missing"
    if row.get("oom"):
        return "OOM"
    if "error" in row:
        return "error: " + row["error"].strip().splitlines()[-1][:80]
    return None


def _ratio(row: dict | None, other: dict | None, key: str) -> float | None:
    if _status(row) or _status(other) or not other.get(key) or row.get(key) is None:
        return None
    return row[key] / other[key]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _group_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("kind", "model", "trainer", "length", "rows"))


def _arm(rows: list[dict], row: dict, arm: str) -> dict | None:
    return next((r for r in rows if r["arm"] == arm and _group_key(r) == _group_key(row)), None)


def _best_stock(rows: list[dict], row: dict, key: str, largest: bool = False) -> dict | None:
    candidates = [r for arm in STOCK_ARMS if (r := _arm(rows, row, arm)) and not _status(r) and r.get(key)]
    if not candidates:
        return None
    return (max if largest else min)(candidates, key=lambda r: r[key])


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (str(_group_key(r)), _arm_rank(r["arm"])))


def plan_ratio(row: dict) -> float | None:
    return row["planned"] / row["peak"] if row.get("planned") and row.get("peak") and not _status(row) else None


def grpo_table(rows: list[dict]) -> str:
    head = ["model", "completion", "arm", "peak GiB", "reserved GiB", "device used GiB", "planned GiB"]
    head += ["planned / peak", "s/step", "peak vs stock", "peak vs best stock", "time vs stock", "last loss"]
    lines = []
    for row in _sorted(rows):
        stock, best, status = _arm(rows, row, "stock"), _best_stock(rows, row, "peak"), _status(row)
        cells = [_gib(row.get("peak")), _gib(row.get("reserved")), _gib(row.get("device_used"))]
        cells += [_gib(row.get("planned")), _fmt(plan_ratio(row))]
        if status:
            cells += [status] * 4
        else:
            cells += [f"{row['s_per_step']:.2f}", _fmt(_ratio(row, stock, "peak")), _fmt(_ratio(row, best, "peak"))]
            cells.append(_fmt(_ratio(row, stock, "s_per_step")))
        loss = f"{row['losses'][-1]:.4g}" if row.get("losses") else "n/a"
        lines.append([row["model"], f"{row['rows']} x {row['length']}", row["arm"], *cells, loss])
    return _table(head, lines)


def unsloth_lines(rows: list[dict]) -> list[str]:
    out = []
    for row in [r for r in rows if r["arm"] == "unsloth" and r.get("kind") == "grpo" and not _status(r)]:
        out.append(
            f"- {row['model']}, {row['rows']} x {row['length']}: Unsloth {row.get('unsloth')} "
            f"(trainer {row.get('trainer_class')}, trl {row.get('trl')}); pinned fields it changed: "
            f"{row.get('unsloth_changed') or 'none'}; its own fields: {row.get('unsloth_fields') or 'none'}; "
            f"fields its TRL lacks: {row.get('dropped_fields') or 'none'}"
        )
    return out


def _longest(row: dict) -> str:
    stopped = " (search stopped by the deadline)" if row.get("stopped") else ""
    if row["longest"] is None:
        return "none" + stopped
    if row["first_failure"] is None:
        return f">= {row['longest']} (largest probed){stopped}"
    return str(row["longest"]) + stopped


def _prediction(row: dict) -> list[str]:
    predicted, error = row.get("predicted_longest"), row.get("prediction_error")
    return [str(predicted) if predicted else "none", "n/a" if error is None else f"{error:+.1%}"]


def bisect_table(rows: list[dict]) -> str:
    head = ["model", "arm", "longest completion that fits", "first failure", "vs best stock", "predicted (plan)"]
    head += ["prediction error", "peak GiB", "host RSS GiB", "s/step", "probes"]
    lines = []
    for row in _sorted(rows):
        best = _best_stock(rows, row, "longest", largest=True)
        ratio = _ratio(row, best, "longest") if row.get("longest") else None
        failure = "none" if row["first_failure"] is None else f"{row['first_failure']} ({row['failure_reason']})"
        probes = ", ".join(f"{n}{'' if ok else 'x'}" for n, ok in row["probes"])
        at = [_gib(row.get("peak_at_longest")), _gib(row.get("host_rss_peak"))]
        at.append(_fmt(row.get("s_per_step_at_longest")))
        lines.append([row["model"], row["arm"], _longest(row), failure, _fmt(ratio), *_prediction(row), *at, probes])
    return _table(head, lines)


def single_row_lines(rows: list[dict]) -> list[str]:
    out = []
    for row in [r for r in rows if r.get("single_row")]:
        verdict = _status(row) or f"fits: peak {_gib(row.get('peak'))} GiB, {row['s_per_step']:.1f} s/step"
        where = f"{row['model']}, {row['arm']}, 1 row x {row['length']} (2 rows a step, one per micro-batch)"
        out.append(f"- {where}: {verdict}")
    return out


def profile_table(profiles: list[dict]) -> str:
    from _gpu_profile import CATEGORIES

    head = ["model", "completion", "arm", "clock", "total ms", *(f"{c} %" for c in CATEGORIES)]
    lines = []
    for p in sorted(profiles, key=lambda p: (str(p.get("model")), str(p.get("length")), _arm_rank(p["arm"]))):
        shares = [f"{100 * p['share'][c]:.1f}" for c in CATEGORIES]
        label = [p["model"], f"{p['rows']} x {p['length']}", p["arm"], p["clock"], f"{p['total_ms']:.0f}"]
        lines.append(label + shares)
    return _table(head, lines)


def _arm_rank(arm: str) -> int:
    return ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER)


def pref_table(rows: list[dict]) -> str:
    head = ["model", "trainer", "tokens", "arm", "peak GiB", "reserved GiB", "s/step", "peak vs stock", "time vs stock"]
    lines = []
    for row in _sorted(rows):
        stock, status = _arm(rows, row, "stock"), _status(row)
        timing = [status] * 3 if status else [f"{row['s_per_step']:.2f}"]
        if not status:
            timing += [_fmt(_ratio(row, stock, "peak")), _fmt(_ratio(row, stock, "s_per_step"))]
        label = [row["model"], row["trainer"], f"{row['rows']} x {row['length']}", row["arm"]]
        lines.append([*label, _gib(row.get("peak")), _gib(row.get("reserved")), *timing])
    return _table(head, lines)


def _find(rows: list[dict], kind: str, arm: str, **fields) -> dict | None:
    def match(r):
        return r.get("kind") == kind and r["arm"] == arm and r.get("model") == TARGET_MODEL

    return next((r for r in rows if match(r) and all(r.get(k) == v for k, v in fields.items())), None)


def _measured_targets(rows: list[dict]) -> list[tuple[str, float | None, float, bool]]:
    """(target, measured value, bound, whether a lower value is better)."""
    run = _find(rows, "grpo", TARGET_ARM, length=TARGET_LENGTH)
    arm = {name: _find(rows, "grpo", name, length=TARGET_LENGTH) for name in ("stock", "stock-offload", "unsloth")}
    fit = _find(rows, "bisect", TARGET_ARM)
    best_fit = max(
        (r["longest"] for r in (_find(rows, "bisect", a) for a in STOCK_ARMS) if r and r.get("longest")), default=None
    )
    planned = [plan_ratio(r) for r in rows if r.get("kind") == "grpo" and plan_ratio(r)]
    worst = max((abs(v - 1) for v in planned), default=None)
    longest = fit["longest"] if fit and fit.get("longest") else None
    return [
        ("peak <= 0.40x stock (8B-class, 8 x 8K)", _ratio(run, arm["stock"], "peak") if run else None, 0.40, True),
        ("peak <= 0.50x stock-offload", _ratio(run, arm["stock-offload"], "peak") if run else None, 0.50, True),
        ("s/step <= 1.05x stock", _ratio(run, arm["stock"], "s_per_step") if run else None, 1.05, True),
        ("peak <= Unsloth's", _ratio(run, arm["unsloth"], "peak") if run else None, 1.0, True),
        ("s/step <= Unsloth's", _ratio(run, arm["unsloth"], "s_per_step") if run else None, 1.0, True),
        (
            "longest completion >= 2x the best stock arm's",
            longest / best_fit if longest and best_fit else None,
            2,
            False,
        ),
        (
            "longest completion >= 200K tokens (ratio to 200,000)",
            longest / LONGEST_TOKENS if longest else None,
            1,
            False,
        ),
        (
            "planner within 15% of every planned arm (the largest deviation of planned / peak from 1)",
            worst,
            PLAN_TOLERANCE,
            True,
        ),
    ]


def _speed_and_length_targets(rows: list[dict]) -> list[tuple[str, float | None, float, bool]]:
    """The speed and long-context targets (docs/gpu-and-benchmarks.md), same tuples as _measured_targets."""
    run = _find(rows, "grpo", TARGET_ARM, length=TARGET_LENGTH)
    fastest = _best_stock(rows, run, "s_per_step") if run else None
    fit, unsloth = _find(rows, "bisect", TARGET_ARM), _find(rows, "bisect", "unsloth")
    longest = fit.get("longest") if fit else None
    single = next((r for r in rows if r.get("single_row") and r.get("model") == TARGET_MODEL), None)
    error = fit.get("prediction_error") if fit else None
    return [
        (
            "s/step <= 0.85x the fastest stock arm (stock-liger included)",
            _ratio(run, fastest, "s_per_step"),
            0.85,
            True,
        ),
        (
            f"longest completion >= {LONGEST_8_ROWS:,} tokens x 8 rows (ratio)",
            longest / LONGEST_8_ROWS if longest else None,
            1,
            False,
        ),
        ("longest completion >= Unsloth's", _ratio(fit, unsloth, "longest") if longest else None, 1, False),
        (
            f"1 row x {LONGEST_1_ROW:,} tokens fits (ratio)",
            None if single is None else (0.0 if _status(single) else single["length"] / LONGEST_1_ROW),
            1,
            False,
        ),
        (
            "planned longest within 10% of the measured (absolute error)",
            None if error is None else abs(error),
            0.10,
            True,
        ),
    ]


def targets_table(rows: list[dict]) -> str:
    lines = []
    for name, value, bound, lower in _measured_targets(rows) + _speed_and_length_targets(rows):
        verdict = (
            "not measured" if value is None else ("met" if (value <= bound if lower else value >= bound) else "NOT met")
        )
        lines.append([name, _fmt(value), verdict])
    return _table([f"target ({TARGET_ARM} arm)", "measured", "verdict"], lines)


def _environments(rows: list[dict], metas: list[dict]) -> list[str]:
    keys = ("device", "torch", "transformers", "trl", "peft", "unsloth")
    envs = sorted({tuple(r.get(k) for k in keys) for r in rows if r.get("python")}, key=str)
    lines = [", ".join(f"{k} {v}" for k, v in zip(keys, env) if v) for env in envs]
    commits = sorted({m.get("commit", "unknown") for m in metas}) or ["unknown"]
    return [f"- {line}" for line in lines] + [f"- slimrl commit {', '.join(commits)}"]


def _skipped(row: dict) -> bool:
    return str(row.get("error", "")).startswith("skipped")


def render(rows: list[dict], metas: list[dict] = (), profiles: list[dict] = ()) -> str:
    """The markdown report; skipped rows are listed with their reason, not tabled."""
    skipped = [f"- {r['kind']} {r.get('model')} {r['arm']}: {r['error']}" for r in rows if _skipped(r)]
    rows = [r for r in rows if not _skipped(r)]
    out = ["# GRPO on one GPU: stock TRL, slimrl and Unsloth", "", *_environments(rows, list(metas))]
    parts = [
        ("GRPO, LoRA r=16, bf16 (fp32 on CPU), whole-run peaks, slimrl's plan beside each", "grpo", grpo_table),
        ("Longest GRPO completion that fits (8 rows, one step, synthetic rollouts)", "bisect", bisect_table),
        ("DPO / ORPO, LoRA r=16, bf16 (fp32 on CPU)", "pref", pref_table),
    ]
    for title, kind, table in parts:
        selected = [r for r in rows if r.get("kind") == kind]
        if selected:
            out += ["", f"## {title}", "", table(selected)]
    extras = [
        ("One row, slimrl", single_row_lines(rows)),
        ("Kernel time by category, one profiled step", [profile_table(list(profiles))] if profiles else []),
        ("What Unsloth chose", unsloth_lines(rows)),
        ("Skipped", skipped),
    ]
    for title, lines in extras:
        if lines:
            out += ["", f"## {title}", "", *lines]
    return "\n".join(out + ["", "## Targets", "", targets_table(rows)])
