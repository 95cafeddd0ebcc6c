"""slimrl's memory plan for each arm of bench/gpu_memory.py, printed beside the measured peak so that a GPU run checks
the planner (its target: within 15% of every arm it models). Runs in the parent, in slimrl's environment.

* The plan is made from what the arm ran: the model's shapes, the prompt's token count, the GRPO config, the arm's
  checkpointing (stock arms: True; slimrl arms: the mode and the `slimrl_*` fields the trainer reported). Stock arms
  have no row groups or tiled MLP, so those fields are given as False where this slimrl has them. stock-offload is
  planned as True: TRL 1.16 re-enables checkpointing without transformers' offload at its first scoring pass
  (tests/patches/setup/test_config_offload.py), and its measured peak is stock's to the byte.
* Compared with `torch.cuda.max_memory_allocated`, the plan's CUDA context term (outside PyTorch's allocator) is left
  out: `planned` is what the allocator holds at the peak; `planned_device` adds the context back, for the device's
  used memory. On a CPU (the smoke run) the plan is the CPU plan, compared with the peak RSS as it is. The rollout
  phase is left out: the bench's rollouts are synthetic (no decoding, no KV cache).
* The Unsloth arm is not planned: the planner models TRL's trainers as stock and slimrl run them.
"""

from __future__ import annotations

from _gpu_measure import ACCUMULATION, PROMPT, grpo_fields, qwen_config

STOCK_CHECKPOINTING = {
    "stock": True,
    "stock-offload": True,
    "stock-ga8": True,
    "stock-liger": True,
}  # see the docstring


def prompt_tokens(vocab: int) -> int:
    from slimrl.testing import tiny_tokenizer

    return len(tiny_tokenizer(vocab)(PROMPT)["input_ids"])


def _lever_fields(row: dict) -> dict:
    from slimrl.planning import levers

    if row["arm"].startswith("slimrl"):
        return {k: v for k, v in row.get("settings", {}).items() if k.startswith("slimrl_")}
    if not levers.available():
        return {}
    from slimrl.models.tiled_mlp import TILED_MLP_FIELD
    from slimrl.ops.row_groups import ROWS_FIELD

    return {ROWS_FIELD: False, TILED_MLP_FIELD: False}


def _checkpointing(row: dict):
    if row["arm"] in STOCK_CHECKPOINTING:
        return STOCK_CHECKPOINTING[row["arm"]]
    return row.get("settings", {}).get("checkpointing_mode", True)


def plan_inputs(row: dict, device_total: int | None, max_positions: int | None = None) -> tuple:
    """(model config, GRPO fields, plan keywords) for what the row's arm runs: what `plan` and
    `longest_completion` take."""
    device = row.get("device_kind", "cuda")
    vocab = qwen_config(row["model"], 4096).vocab_size
    fields = grpo_fields(
        row["length"], row["rows"], 1, device, row.get("accumulation") or ACCUMULATION.get(row["arm"], 1)
    )
    fields = {k: v for k, v in fields.items() if k not in ("report_to", "use_cpu")}
    keywords = dict(
        prompt_length=prompt_tokens(vocab),
        lora_r=16,
        dtype="bfloat16" if device == "cuda" else "float32",
        use_gradient_checkpointing=_checkpointing(row),
        device=device,
        device_memory_gb=(device_total or 80 * 1024**3) / 1024**3,
    )
    config = qwen_config(row["model"], max_positions or max(4096, 2 * row["length"]))
    return config, dict(fields, **_lever_fields(row)), keywords


def planned(row: dict, device_total: int | None) -> dict:
    """The plan's figures for one GRPO row (empty for arms it does not model)."""
    from slimrl.planning import plan
    from slimrl.planning.terms import CUDA_CONTEXT_BYTES

    if row.get("kind") != "grpo" or row["arm"].startswith("unsloth"):
        return {}
    config, fields, keywords = plan_inputs(row, device_total)
    p = plan(config, fields, "grpo", **keywords)
    phases = {name: p.phase_bytes(name) for name in p.phases if name != "rollout"}
    phase = max(phases, key=phases.get)
    context = CUDA_CONTEXT_BYTES if keywords["device"] == "cuda" else 0
    carried = max(p.phase_heap(name) for name in phases) - p.phase_heap(phase)  # CPU: heap kept from another phase
    allocated = p.resident_bytes - context + phases[phase] + carried
    return {
        "planned": allocated,
        "planned_device": allocated + context,
        "planned_phase": phase,
        "planned_group_rows": p.run.policy_rows,
        "planned_terms": {t.name: t.bytes for t in [*p.resident, *p.phases[phase]]},
    }


def predicted_longest(
    arm: str, model: str, rows: int, device: str, device_total: int | None, resolution: int, maximum: int
) -> dict:
    """slimrl's prediction of the longest completion that fits, made before any probe runs:
    `slimrl.planning.longest.longest_completion` on what the arm runs (`predicted_longest`, 0 where no length fits, and
    the planner's whole answer as `prediction`; None with a `prediction_note` where there is none: Unsloth is not
    planned, or this slimrl has no such function)."""
    if arm.startswith("unsloth"):
        return {
            "predicted_longest": None,
            "prediction_note": "not planned: the planner models TRL as stock and slimrl run it",
        }
    try:
        from slimrl.planning.longest import longest_completion
    except ImportError as exc:
        return {"predicted_longest": None, "prediction_note": f"this slimrl has no longest_completion ({exc})"}
    row = {"kind": "grpo", "arm": arm, "model": model, "length": resolution, "rows": rows, "device_kind": device}
    config, fields, keywords = plan_inputs(row, device_total, max_positions=2 * maximum)
    try:
        answer = longest_completion(config, fields, "grpo", resolution=resolution, maximum=maximum, **keywords)
    except Exception as exc:  # noqa: BLE001 - a prediction that fails is reported, the search still runs
        return {"predicted_longest": None, "prediction_note": f"{type(exc).__name__}: {exc}"[:300]}
    return {"predicted_longest": answer["longest_completion"], "prediction": answer}
