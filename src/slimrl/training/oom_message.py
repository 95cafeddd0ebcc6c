"""The out-of-memory message: what the step needed (measured and planned) and the settings that would fit.

The plan comes from the live trainer (slimrl.planning.plan on the model's config, its LoRA config, its dtype and
checkpointing mode, the trainer's config; the prompt length from the rollout buffer when there is one), so it is
the same model `slimrl plan` prints. A plan that cannot be made (an architecture the planner cannot build) is
reported as such; it never hides the out-of-memory error.
"""

from __future__ import annotations

from ..memory import gib
from ..models.checkpointing import checkpointing_mode
from ..planning.breakdown import GiB, suggestions
from ..planning.plan import plan
from ..planning.run import algorithm_of
from .budget import budget_gb

MAX_SUGGESTIONS = 5


def _prompt_length(trainer) -> int | None:
    buffer = getattr(trainer, "_buffered_inputs", None)
    if buffer:
        return int(buffer[0]["prompt_ids"].shape[1])
    return None


def plan_for_trainer(trainer):
    """slimrl's memory plan for the trainer's current step."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    peft = getattr(model, "peft_config", None) or {}
    lora = next(iter(peft.values()), None)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtype = next(base.parameters()).dtype
    mode = checkpointing_mode(model)
    return plan(
        base.config,
        trainer.args,
        algorithm_of(trainer.args),
        prompt_length=_prompt_length(trainer),
        lora_r=lora.r if lora is not None else None,
        lora_target_modules=sorted(lora.target_modules) if lora is not None else None,
        full_finetuning=lora is None,
        dtype=str(dtype) if dtype.is_floating_point else "bfloat16",
        load_in_4bit=bool(getattr(base, "is_loaded_in_4bit", False)),
        use_gradient_checkpointing=mode if mode is not None else None,
        fast_inference=getattr(model, "vllm_engine", None) is not None,
        device=trainer.accelerator.device.type,
        device_memory_gb=budget_gb(trainer.args),
    )


def _plan_lines(trainer) -> list[str]:
    try:
        p = plan_for_trainer(trainer)
    except Exception as exc:  # noqa: BLE001 - a missing plan must not hide the out-of-memory error
        return [f"  (no memory plan for this model: {exc})"]
    largest = sorted(((n, b) for n, b in p.terms().items() if n != "runtime"), key=lambda kv: -kv[1])[:3]
    lines = [
        f"  Planned peak of this step: {p.peak_bytes / GiB:.2f} GiB (during the {p.peak_phase}; largest parts: "
        + ", ".join(f"{name} {size / GiB:.2f} GiB" for name, size in largest)
        + f") against {p.device_label}."
    ]
    options = suggestions(p)[:MAX_SUGGESTIONS]
    if not p.fits:
        fitting = [(change, q) for change, q in options if q.fits]
        lines.append(
            "  Settings that would fit by the plan, each alone:"
            if fitting
            else "  No single setting fits by the plan; combine these (slimrl plan shows the breakdown):"
        )
        options = fitting or options
    else:
        lines.append(
            "  The plan is under the limit, so the step needed more than planned (fragmentation, other "
            "processes, longer inputs); the settings that lower it most, each alone:"
        )
    if not options:
        lines[-1] = "  No single setting lowers the plan by 1% or more."
    lines += [
        f"    {change:<62} plan {q.peak_bytes / GiB:.2f} GiB (-{(p.peak_bytes - q.peak_bytes) / GiB:.2f})"
        for change, q in options
    ]
    return lines


def explain(trainer, start, reason: str, kept: str) -> str:
    step = trainer.state.global_step + 1
    lines = [f"Training step {step} of {trainer.state.max_steps} stopped, {reason}."]
    if start.last_step_peak:
        lines.append(
            f"  Memory high-water mark when the last completed step ended: {gib(start.last_step_peak):.2f} GiB."
        )
    lines += _plan_lines(trainer)
    lines.append(f"  {kept}")
    return "\n".join(lines)
