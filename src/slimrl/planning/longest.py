"""The longest completion a plan fits: `longest_completion(model, config, algorithm, ...)` plans a training step at
every completion length that is a multiple of `resolution`, up to `maximum`, and returns the longest whose planned
peak fits the device memory, before anything is loaded (`slimrl plan ... --longest`).

Choices:
1. Every multiple is planned, no bisection: the planned peak is not monotonic in the length. "auto" row groups hold
   up to AUTO_GROUP_TOKENS tokens, so longer rows can mean fewer rows a group and a lower peak, and "auto" tiles the
   MLP only past a threshold. The model is built once, on the meta device; each length is arithmetic on its shape
   (a few hundred lengths take well under a second).
2. Only the completion moves. The prompt stays the base plan's (`prompt_length`, or the plan's default for the
   config's own completion length), and so do the rows, the device and every other setting; the row groups are
   resolved at each length by the levers' own rule (slimrl.planning.levers.group_rows).
3. Fitting is MemoryPlan.fits: planned peak <= device memory (`device_memory_gb`, or the GPU's). Host memory for
   offload limits nothing here; the result names what the longest length needs (the trainer checks it at set-up,
   slimrl.patches.setup.offload_checks).
4. The result is a dict (`RESULT_KEYS`), JSON-ready; `longest_completion` is 0 when not even `resolution` tokens fit,
   and `reason` then says by how much. Bad arguments raise ValueError before anything is planned.
"""

from __future__ import annotations

from dataclasses import replace

from ..families import ONLINE
from . import levers
from .breakdown import GiB, MemoryPlan, build_plan
from .plan import plan
from .terms import offloaded_inputs

RESULT_KEYS = (
    "longest_completion",  # completion tokens per row (a multiple of resolution; 0: none fits)
    "contiguous",  # every multiple up to this length fits (what a search assuming a monotonic peak finds)
    "resolution",
    "maximum",
    "at_maximum",  # the scan's last length fits: a longer one may too
    "field",  # the config field to set: max_completion_length (GRPO/RLOO), max_length (offline: prompt + completion)
    "value",  # that field's value for the longest completion
    "algorithm",
    "rows",  # rows per micro-batch
    "group_rows",  # rows one policy forward and backward holds at the longest length
    "prompt_length",
    "peak_bytes",  # planned peak at the longest length (at `resolution` when none fits)
    "peak_phase",
    "device_bytes",
    "device",
    "host_offload_bytes",  # host memory offload needs at the longest length (0: offload off)
    "lengths_planned",
    "rollout",  # the rollout phase was planned (False: left out)
    "reason",  # why the scan stopped where it did
)


def _check(resolution, maximum) -> None:
    for name, value in (("resolution", resolution), ("maximum", maximum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"longest_completion: {name} must be a positive number of tokens, not {value!r}")
    if maximum < resolution:
        raise ValueError(f"longest_completion: maximum ({maximum:,}) is below resolution ({resolution:,})")


def plan_at(base: MemoryPlan, completion: int, rollout: bool = True) -> MemoryPlan:
    """`base` planned at another completion length: same prompt, rows and settings, row groups resolved again;
    `rollout=False` leaves the rollout phase out."""
    r = base.run
    rows = levers.group_rows(r.rows_per_group, r.batch, r.prompt_length + completion, r.device)
    run = replace(r, completion_length=completion, group_rows=rows)
    planned = build_plan(base.model, run, base.device_bytes, base.device_label)
    if not rollout:
        planned.phases.pop("rollout", None)
    return planned


def _reason(plans: dict[int, MemoryPlan], longest: int, resolution: int, maximum: int) -> str:
    if not longest:
        first = plans[resolution]
        resident = first.resident_bytes / GiB
        return (
            f"no completion length fits: at {resolution:,} tokens the plan needs {first.peak_gb:.2f} GiB "
            f"(resident alone {resident:.2f} GiB), the device has {first.device_bytes / GiB:.2f} GiB"
        )
    if longest == maximum:
        return f"the scan's maximum, {maximum:,} tokens, fits: a longer completion may fit too"
    after = plans[longest + resolution]
    return (
        f"{longest + resolution:,} tokens plan {after.peak_gb:.2f} GiB (during the {after.peak_phase}), over the "
        f"device's {after.device_bytes / GiB:.2f} GiB"
    )


def longest_completion(
    config,
    fields=None,
    algorithm: str | None = None,
    *,
    resolution: int = 4096,
    maximum: int = 1_048_576,
    rollout: bool = True,
    **plan_kwargs,
) -> dict:
    """The longest completion (tokens per row, a multiple of `resolution`, at most `maximum`) whose planned step fits.

    config, fields, algorithm and `plan_kwargs` are `slimrl.plan`'s arguments (the model, the TRL config or its
    fields, the algorithm; e.g. device="cuda", device_memory_gb=80, prompt_length=512, lora_r=16). rollout=False:
    the rollout phase (generation's KV cache, a vLLM engine's share) is left out, for steps whose rollouts are given
    rather than generated (a benchmark's synthetic ones). Returns a dict with the keys of RESULT_KEYS (module
    docstring); `longest_completion` is 0 when no length fits.
    """
    _check(resolution, maximum)
    base = plan(config, fields, algorithm, **plan_kwargs)
    plans = {length: plan_at(base, length, rollout) for length in range(resolution, maximum + 1, resolution)}
    fitting = [length for length, p in plans.items() if p.fits]
    longest = max(fitting, default=0)
    contiguous = next((length - resolution for length, p in plans.items() if not p.fits), max(plans))
    at = plans[longest or resolution]
    r = at.run
    online = r.algorithm in ONLINE
    return {
        "longest_completion": longest,
        "contiguous": contiguous,
        "resolution": resolution,
        "maximum": maximum,
        "at_maximum": max(plans) in fitting,
        "field": "max_completion_length" if online else "max_length",
        "value": (longest if online else r.prompt_length + longest) if longest else 0,
        "algorithm": r.algorithm,
        "rows": r.batch,
        "group_rows": r.policy_rows,
        "prompt_length": r.prompt_length,
        "peak_bytes": at.peak_bytes,
        "peak_phase": at.peak_phase,
        "device_bytes": at.device_bytes,
        "device": at.device_label,
        "host_offload_bytes": offloaded_inputs(at.model, r).bytes,
        "lengths_planned": len(plans),
        "rollout": rollout,
        "reason": _reason(plans, longest, resolution, max(plans)),
    }


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def render_longest(result: dict) -> str:
    """The lines `slimrl plan --longest` prints."""
    if not result["longest_completion"]:
        return f"  longest completion: none fits ({result['reason']})"
    lines = [
        f"  longest completion that fits: {result['longest_completion']:,} tokens a row x {_rows(result['rows'])} "
        f"(prompt {result['prompt_length']:,}; {_rows(result['group_rows'])} a forward), planned peak "
        f"{result['peak_bytes'] / GiB:.2f} of {result['device_bytes'] / GiB:.2f} GiB; "
        f"{result['field']}={result['value']}",
        f"    every multiple of {result['resolution']:,} up to {result['maximum']:,} planned; {result['reason']}",
    ]
    if result["contiguous"] != result["longest_completion"]:
        lines.append(
            f"    the peak is not monotonic in the length: every length up to {result['contiguous']:,} fits, some "
            f"longer ones do not"
        )
    if result["host_offload_bytes"]:
        host = result["host_offload_bytes"] / 2**20
        lines.append(f"    offload holds {host:,.0f} MiB of host memory at that length")
    return "\n".join(lines)
