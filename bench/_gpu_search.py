"""The longest completion that fits, for bench/gpu_memory.py: a galloping search then bisection on multiples of a
resolution (each probe one training step in a fresh process, "fits" = it finished without error), and the first
probe guessed from measured rows (a linear fit of the peak reaches the GPU's memory)."""

from __future__ import annotations


def longest_fit(probe, start: int, resolution: int, maximum: int, step: int | None = None) -> dict:
    """Largest multiple of `resolution` <= `maximum` for which `probe(length)` is true, assuming monotonicity.

    Gallops from `start` (steps `step`, doubling; default `start`, i.e. doubling lengths) until the answer is
    bracketed, then bisects. Returns the longest fit (None if nothing down to `resolution` fits), the first failing
    length (None if `maximum` fits) and every probe in order. A probe returning None stops the search: the result is
    then the bracket found so far, marked `stopped`."""
    results: dict[int, bool] = {}

    def fits(length: int) -> bool:
        if length not in results:
            ok = probe(length)
            if ok is None:  # the prober ran out of time: report the bracket found so far
                raise _Stopped
            results[length] = bool(ok)
        return results[length]

    try:
        lo, hi = _search(fits, start, resolution, maximum, step or start)
    except _Stopped:
        lo = max((n for n, ok in results.items() if ok), default=None)
        hi = min((n for n, ok in results.items() if not ok), default=None)
        return {"longest": lo, "first_failure": hi, "probes": list(results.items()), "stopped": True}
    return {"longest": lo, "first_failure": hi, "probes": list(results.items()), "stopped": False}


class _Stopped(Exception):
    pass


def _search(fits, start: int, resolution: int, maximum: int, step: int) -> tuple[int | None, int | None]:
    lo = hi = None
    if fits(start):
        lo = start
        while lo < maximum and hi is None:
            length = min(lo + step, maximum)
            lo, hi = (length, None) if fits(length) else (lo, length)
            step *= 2
    else:
        hi = start
        while lo is None and hi > resolution:
            length = max(hi - step, resolution)
            lo, hi = (length, hi) if fits(length) else (None, length)
            step *= 2
    while lo is not None and hi is not None and hi - lo > resolution:
        mid = lo + (hi - lo) // 2 // resolution * resolution
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, hi


def guess_longest(rows: list[dict], model: str, arm: str, resolution: int) -> int | None:
    """Length where a linear fit of the reserved peak (GRPO rows of `model`/`arm`) reaches the GPU's memory."""
    points = sorted(
        {
            (r["length"], r["reserved"])
            for r in rows
            if r.get("kind") == "grpo"
            and r["model"] == model
            and r["arm"] == arm
            and not r.get("oom")
            and r.get("reserved")
            and "error" not in r
        }
    )
    if len(points) < 2:
        return None
    (l0, p0), (l1, p1) = points[0], points[-1]
    slope = (p1 - p0) / (l1 - l0)
    total = next(r["device_total"] for r in rows if r.get("device_total"))
    if slope <= 0:
        return None
    return max(resolution, int((total - p0) / slope + l0) // resolution * resolution)
