"""The longest-completion search of bench/gpu_memory.py (`--only bisect`), per arm of --bisect-arms (default slimrl,
stock-ga8, unsloth), `--rows` rows a step:

1. The prediction, made before any probe: slimrl's `longest_completion` for what the arm runs
   (bench/_gpu_plan.py's `predicted_longest`), on the device's memory (--device-memory-gib, else read by a short child
   process). It is the first probe; without one (Unsloth, or a slimrl without the function), a linear fit of measured
   rows (--guess-from), else --start.
2. The search (bench/_gpu_search.py): galloping from the first probe in steps of --resolution, doubling, until a probe
   fails, then bisection to --resolution. Each probe is one optimizer step in a fresh process, stopped after
   --timeout seconds; a probe stopped so, or one the command's --deadline leaves no time for, ends the arm's search
   with the bracket found so far (`stopped`): a timeout is no evidence about memory.
3. The row (kind "bisect"): the longest length that fits and the first that does not, with the reason; the peak,
   host RSS peak and s/step of the probe at the longest length (one step, so s/step includes the first step's
   set-up); slimrl's plan for that probe (`plan_at_longest`); `predicted_longest` and `prediction_error`
   ((predicted - measured) / measured, only where the search bracketed the answer).
4. For slimrl, one more probe: one row at a time at --single-row-length (default 262144) tokens (kind "probe",
   `single_row`): GRPO needs at least 2 completions of a prompt, so the step has 2 rows, one per micro-batch
   (accumulation 2): the memory of one row.
"""

from __future__ import annotations

import os

from _gpu_search import guess_longest, longest_fit

KEPT = ("peak", "reserved", "device_used", "host_rss_peak", "s_per_step", "step_times", "device", "device_total")


def device_total(r) -> int | None:
    """Bytes of the device's memory: --device-memory-gib, the host's memory on CPU, else a child reads it."""
    if r.a.device_memory_gib:
        return int(r.a.device_memory_gib * 1024**3)
    if r.a.device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    out = r.clock.run(["--child", "device", *r.common], r.a.threads, timeout=180) or {}
    return out.get("device_total")


def first_probe(r, arm: str, model: str, total: int | None, known: list[dict]) -> dict:
    """The prediction and where the first probe comes from (`guess`, `guess_source`)."""
    from _gpu_plan import predicted_longest

    a = r.a
    out = predicted_longest(arm, model, a.rows, a.device, total, a.resolution, a.maximum)
    guess, source = out["predicted_longest"], "plan"
    if not guess:
        guess, source = guess_longest(known + r.rows, model, arm, a.resolution), "measured rows"
    if not guess:
        guess, source = a.start, "--start"
    guess = min(max(guess // a.resolution * a.resolution, a.resolution), a.maximum)
    return dict(out, guess=guess, guess_source=source)


def _at_longest(out: dict, total: int | None) -> dict:
    from _gpu_plan import planned

    kept = {f"{k}_at_longest" if k in ("peak", "s_per_step") else k: out.get(k) for k in KEPT}
    if not out.get("arm", "").startswith("slimrl"):
        return kept
    try:
        plan = planned(dict(out, kind="grpo"), total)
    except Exception as exc:  # noqa: BLE001 - a plan that fails is reported, the measurement kept
        return dict(kept, plan_at_longest_error=f"{type(exc).__name__}: {exc}")
    return dict(kept, plan_at_longest={k: v for k, v in plan.items() if k != "planned_terms"})


def search_arm(r, model: str, arm: str, total: int | None, known: list[dict]) -> dict:
    """One arm's search (module docstring); returns its bisect row."""
    row = {"kind": "bisect", "arm": arm, "model": model, "rows": r.a.rows, "resolution": r.a.resolution}
    skipped = r.skip_reason(arm)
    if skipped:
        return dict(row, error=f"skipped: {skipped}", skipped=skipped)
    row.update(first_probe(r, arm, model, total, known))
    outcomes: dict[int, dict] = {}

    def probe(length: int) -> bool | None:
        out = r.child("grpo", arm, model, length, 1, r.a.rows)
        if str(out.get("error", "")).startswith("skipped"):
            return None
        outcomes[length] = out
        r.add({**out, "kind": "probe", "arm": arm, "model": model, "length": length, "rows": r.a.rows})
        if str(out.get("error", "")).startswith("timeout"):
            return None
        return not out.get("oom") and "error" not in out

    found = longest_fit(probe, row["guess"], r.a.resolution, r.a.maximum, step=r.a.resolution)
    failure = outcomes.get(found["first_failure"], {})
    stop = next((o["error"] for o in outcomes.values() if str(o.get("error", "")).startswith("timeout")), None)
    reason = "OOM" if failure.get("oom") else failure.get("error", "")[:200] or None
    row.update(found, failure_reason=reason, stop_reason=stop if found["stopped"] else None)
    if found["longest"] is not None:
        row.update(_at_longest(outcomes[found["longest"]], total))
    measured, predicted = found["longest"], row.get("predicted_longest")
    bracketed = measured and predicted and found["first_failure"] is not None and not found["stopped"]
    row["prediction_error"] = (predicted - measured) / measured if bracketed else None
    return row


def single_row_probe(r, model: str, total: int | None) -> None:
    length = r.a.single_row_length
    out = r.child("grpo", "slimrl", model, length, 1, 2, accumulation=2)
    row = {**out, "kind": "probe", "arm": "slimrl", "model": model, "length": length, "rows": 2, "single_row": True}
    row["accumulation"] = 2
    if "error" not in out:
        row.update({k: v for k, v in _at_longest(out, total).items() if k.startswith("plan")})
    r.add(row)


def run_search(r, model: str, known: list[dict]) -> None:
    total = device_total(r)
    for arm in r.a.bisect_arms:
        r.add(search_arm(r, model, arm, total, known))
    if "slimrl" in r.a.bisect_arms and r.a.single_row_length:
        single_row_probe(r, model, total)
