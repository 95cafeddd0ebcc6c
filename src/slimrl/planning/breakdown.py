"""A memory plan: its terms grouped into resident memory and step phases, the peak, whether it fits, its text form and
the settings that would make it fit.

How the terms (formulas: slimrl.planning.terms) combine:
- resident, alive the whole step: runtime, weights, a reference copy, the LoRA adapter, AdamW's moments (present
  from the first optimizer step on: a plan is for a steady step), and on CPU a vLLM engine's share;
- phases, one after the other inside the step:
    rollout          KV cache + decoding (+ the engine's share on CUDA, asleep during training)
    scoring          one no-grad forward (old policy / reference), online and offline
    policy forward   saved activations + gradients + the head's forward buffers
    policy backward  saved activations + gradients + the larger of the head's backward and one block's recompute
    optimizer step   gradients + the optimizer's temporaries
  Gradients count in both policy phases: with gradient accumulation they live from the first micro-batch's
  backward to the optimizer step.
- CUDA: peak = resident + the largest phase (torch's caching allocator reuses freed blocks; the plan is what it
  allocates, the context is the runtime term).
- CPU: peak = resident + the largest heap part of any phase + the largest mmap part of any phase. glibc serves
  blocks under its mmap threshold (1 MiB, as slimrl sets it for a patched trainer: training/cpu_heap.py) from its
  heap and keeps them resident once freed (they are reused, not returned), larger blocks are mmapped and returned
  on free; so in a steady step the heap high-water mark of one phase (a rollout's
  KV cache, the activations) is still resident when another phase maps its large buffers (the log-prob tiles).
Not modelled (why a plan is a plan): fragmentation beyond that, the dataset, tokenizer and Python objects beyond
the runtime term, attention score matrices of an eager attention implementation (SDPA keeps none).

Settings that would fit (`suggestions`, also named by an out-of-memory stop), each tried alone on the plan: more
log-prob chunks (slimrl_num_chunks: the fewest that fit, up to 64 times the current count), gradient checkpointing
(True, or "offload" on CUDA), half the completion length, half the rows per micro-batch (gradient accumulation
doubled, so the optimizer sees the same batch), half the generations per prompt with half the rows, shared-prefix
forwards (slimrl_shared_prefix=True, where this slimrl has the option), 4-bit base weights (LoRA). `render` is the
text `slimrl plan` prints.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace

from ..families import ONLINE, SHARED_PREFIX
from . import levers, terms
from .run import RunShape
from .shapes import ModelShape
from .terms import MiB, head_rows, scored_tokens

GiB = terms.GiB
CHUNK_STEPS = (2, 4, 8, 16, 32, 64)  # chunk counts tried, as multiples of the current one: the first that fits


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    formula: str = ""
    heap: int = 0  # the part in blocks under terms.HEAP_LIMIT (CPU: they stay resident once freed)


@dataclass
class MemoryPlan:
    """The predicted peak of one training step and its parts (bytes)."""

    model: ModelShape
    run: RunShape
    resident: list[Term]
    phases: dict[str, list[Term]]
    device_bytes: int
    device_label: str
    notes: list[str] = field(default_factory=list)

    @property
    def resident_bytes(self) -> int:
        return sum(t.bytes for t in self.resident)

    def phase_bytes(self, phase: str) -> int:
        return sum(t.bytes for t in self.phases[phase])

    def phase_heap(self, phase: str) -> int:
        return sum(t.heap for t in self.phases[phase]) if self.run.device == "cpu" else 0

    @property
    def heap_phase(self) -> str:
        """The phase whose heap part stays resident for the others (CPU)."""
        return max(self.phases, key=self.phase_heap)

    @property
    def carried_heap(self) -> int:
        """Heap bytes freed by an earlier phase but still resident in the peak phase (CPU; 0 on CUDA)."""
        return max(0, self.phase_heap(self.heap_phase) - self.phase_heap(self.peak_phase))

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: (self.phase_bytes(p) - self.phase_heap(p), self.phase_bytes(p)))

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.phase_bytes(self.peak_phase) + self.carried_heap

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GiB

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.device_bytes

    def terms(self) -> dict[str, int]:
        """Every term by name (resident terms, then the peak phase's)."""
        return {t.name: t.bytes for t in [*self.resident, *self.phases[self.peak_phase]]}

    def to_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "fits": self.fits,
            "carried_heap_bytes": self.carried_heap,
            "heap_phase": self.heap_phase,
            "host_offload_bytes": terms.offloaded_inputs(self.model, self.run).bytes,
            "device_bytes": self.device_bytes,
            "device": self.device_label,
            "resident": {t.name: t.bytes for t in self.resident},
            "phases": {p: {t.name: t.bytes for t in ts} for p, ts in self.phases.items()},
            "notes": self.notes,
        }

    def __str__(self) -> str:
        return render(self)


def _term(name, part: terms.Part) -> Term:
    return Term(name, part.bytes, part.formula, part.heap)


def build_plan(m: ModelShape, r: RunShape, device_bytes: int, device_label: str) -> MemoryPlan:
    runtime = (
        terms.Part(terms.CUDA_CONTEXT_BYTES, "CUDA context and kernels")
        if r.device == "cuda"
        else terms.Part(terms.RUNTIME_CPU_BYTES, "libtorch, transformers, TRL resident (measured)")
    )
    resident = [_term("runtime", runtime), _term("weights", terms.weights(m, r))]
    if r.reference == "copy":
        resident.append(_term("reference copy", terms.weights(m, r)))
    if r.lora:
        resident.append(_term("LoRA adapter", terms.adapter(m, r)))
    resident.append(_term("optimizer state", terms.optimizer_state(m, r)))
    engine = _term("vLLM engine", terms.engine_share(r, device_bytes))
    if r.device != "cuda" and engine.bytes:
        resident.append(engine)
    grads = _term("gradients", terms.gradients(m, r))
    saved = _term("saved activations", terms.saved_activations(m, r))
    scored = terms.scored_tokens(r)
    backward = terms.head_backward(m, r, scored)
    recompute = terms.recompute(m, r)
    phases: dict[str, list[Term]] = {}
    if r.algorithm in ONLINE:
        phases["rollout"] = [_term("KV cache", terms.kv_cache(m, r)), _term("decoding", terms.decoding(m, r))]
        if r.device == "cuda" and engine.bytes:
            phases["rollout"].append(engine)
    if r.scoring_forwards or r.ref_forward:
        phases["scoring"] = [_term("no-grad forward", terms.scoring_forward(m, r))]
    phases["policy forward"] = [saved, grads, _term("log-prob head (forward)", terms.head_forward(m, r, scored))]
    phases["policy backward"] = [
        saved,
        grads,
        _term("log-prob head (backward)", backward)
        if backward.bytes >= recompute.bytes
        else _term("block recompute", recompute),
    ]
    phases["optimizer step"] = [grads, _term("optimizer temporaries", terms.optimizer_temporaries(m, r))]
    plan = MemoryPlan(m, r, resident, phases, device_bytes, device_label)
    host = terms.offloaded_inputs(m, r)
    if host.bytes:
        plan.notes.append(f"host memory for offloaded block inputs: {host.bytes / GiB:.2f} GiB ({host.formula})")
    return plan


def replan(p: MemoryPlan, **changes) -> MemoryPlan:
    """The same plan with RunShape fields changed (what a knob would give)."""
    return build_plan(p.model, replace(p.run, **changes), p.device_bytes, p.device_label)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _describe(p: MemoryPlan) -> list[str]:
    m, r = p.model, p.run
    adapter = f"LoRA ({m.lora_params:,} parameters)" if r.lora else "full fine-tuning"
    weights = "4-bit" if r.load_in_4bit else f"{8 * r.weight_bytes}-bit weights"
    lines = [
        f"{r.algorithm.upper()} step on {m.name} ({m.model_type}: {m.num_layers} layers, hidden {m.hidden}, "
        f"vocabulary {m.vocab:,}, {m.num_params / 1e6:,.1f}M parameters), {adapter}, {weights}, "
        f"{r.device.upper()}",
        f"  {r.batch} rows per micro-batch x (prompt {r.prompt_length} + completion {r.completion_length}) tokens"
        + (f", {r.generation_rows} rows generated at once" if r.algorithm in ONLINE else "")
        + f", checkpointing {r.checkpointing!r}, slimrl_num_chunks {r.num_chunks}"
        + (f", scored {r.policy_rows} rows at a time" if r.policy_rows != r.batch else "")
        + (f", tiled MLP {r.tiled_mlp!r}" if r.tiled_mlp is not False else ""),
    ]
    return lines


def render(p: MemoryPlan) -> str:
    lines = _describe(p) + ["", f"  {'resident':<34}{_gib(p.resident_bytes):>11}"]
    lines += [f"    {t.name:<32}{_gib(t.bytes):>11}   {t.formula}" for t in p.resident if t.bytes]
    lines.append("  step phases")
    for phase, parts in p.phases.items():
        mark = "  <- peak" if phase == p.peak_phase else ""
        lines.append(f"    {phase:<32}{_gib(p.phase_bytes(phase)):>11}{mark}")
        lines += [f"      {t.name:<30}{_gib(t.bytes):>11}   {t.formula}" for t in parts if t.bytes]
    if p.carried_heap >= MiB:
        label = f"heap kept from the {p.heap_phase}"
        lines.append(f"    {label:<32}{_gib(p.carried_heap):>11}   CPU: glibc keeps freed blocks under 32 MiB resident")
    verdict = "fits" if p.fits else "does NOT fit"
    lines += [
        "",
        f"  peak {_gib(p.peak_bytes)} (during the {p.peak_phase}); {p.device_label}: {verdict} "
        f"({100 * p.peak_bytes / p.device_bytes:.0f}% of it)",
    ]
    lines += [f"  note: {n}" for n in p.notes]
    lines += levers.describe(p, terms.policy_tokens(p.run), terms.offloaded_inputs(p.model, p.run).bytes)
    if not p.fits:
        options = suggestions(p)
        fitting = [(change, q) for change, q in options if q.fits]
        lines.append(
            "  settings that fit, each alone:"
            if fitting
            else "  no single setting fits; the largest savings (combine them):"
        )
        lines += [f"    {change:<62} plan {_gib(q.peak_bytes)}" for change, q in (fitting or options[:5])]
    return "\n".join(lines)


def shared_prefix_available() -> bool:
    return importlib.util.find_spec("slimrl.patches.scoring.shared_prefix") is not None


def suggestions(p: MemoryPlan) -> list[tuple[str, MemoryPlan]]:
    """(setting, plan with it) for each knob that lowers the peak, lowest peak first."""
    r, out = p.run, []
    chunks_now = -(-scored_tokens(r) // max(head_rows(p.model, r, scored_tokens(r)), 1))
    more_chunks = [(f"slimrl_num_chunks={k * chunks_now}", replan(p, num_chunks=k * chunks_now)) for k in CHUNK_STEPS]
    out.append(next((option for option in more_chunks if option[1].fits), more_chunks[-1]))
    if r.checkpointing is False:
        out.append(("use_gradient_checkpointing=True", replan(p, checkpointing=True)))
    if r.checkpointing is True and replace(r, checkpointing="offload").offload_moves:
        out.append(('use_gradient_checkpointing="offload"', replan(p, checkpointing="offload")))
    if r.completion_length > 1:
        half = r.completion_length // 2
        field = "max_completion_length" if r.algorithm in ONLINE else "max_length"
        value = half if field == "max_completion_length" else r.prompt_length + half
        out.append((f"{field}={value}", replan(p, completion_length=half)))
    if r.batch > 1:
        half = r.batch // 2
        out.append(
            (
                f"per_device_train_batch_size={half}, gradient_accumulation_steps={2 * r.grad_accum}",
                replan(p, batch=half, grad_accum=2 * r.grad_accum),
            )
        )
        if r.algorithm in ONLINE and r.num_generations >= 4:
            out.append(
                (
                    f"num_generations={r.num_generations // 2}, per_device_train_batch_size={half}",
                    replan(
                        p, batch=half, num_generations=r.num_generations // 2, generation_rows=r.generation_rows // 2
                    ),
                )
            )
    if shared_prefix_available() and not r.shared_prefix and r.algorithm in SHARED_PREFIX:
        out.append(("slimrl_shared_prefix=True", replan(p, shared_prefix=True)))
    if r.lora and not r.load_in_4bit:
        out.append(("load_in_4bit=True", replan(p, load_in_4bit=True)))
    least = max(p.peak_bytes // 100, 1024**2)  # a setting must save at least 1% (and 1 MiB) to be worth naming
    return sorted([(c, q) for c, q in out if p.peak_bytes - q.peak_bytes >= least], key=lambda cq: cq[1].peak_bytes)
