"""A training run's shape for the memory planner: the TRL config fields (and model-loading choices) that size memory.

Choices:
1. Fields are read from a TRL config object, a dict, or keywords, in that order of precedence reversed (keywords
   win); a field nobody gave takes TRL's own dataclass default for the algorithm (read from the dataclass, no
   config is built), so a plan matches what a bare TRL config would do.
2. Lengths are worst cases: every completion runs to max_completion_length (a random or rambling model does),
   prompts are `prompt_length` tokens (GRPO has no prompt-length field: default max_seq_length minus the completion
   length when max_seq_length is given, else 512). Offline trainers train on `max_length` tokens per row; the
   completion part is `max_length - prompt_length` (default: half of max_length).
3. The reference model: none for GRPO with beta=0 and for ORPO/CPO; with LoRA the adapter-disabled model (no copy);
   with full fine-tuning a second copy of the weights. DPO/KTO's `precompute_ref_log_probs` removes the per-step
   reference forward.
4. Row groups and the tiled MLP (GRPO/RLOO): their config fields, resolved by the levers' own rules
   (slimrl.planning.levers); the policy phases then hold one group's rows, the recompute one MLP shard. The settings
   themselves are kept too (the padding-free one only for the plan's text), so a plan at another length resolves
   its groups by the same rule (slimrl.planning.longest).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import fields
from ..families import NO_REFERENCE, ONLINE
from ..models.checkpointing import config_inputs, normalize_mode, resolve_checkpointing
from . import levers

CONFIG_CLASSES = {
    "grpo": ("trl", "GRPOConfig"),
    "rloo": ("trl", "RLOOConfig"),
    "dpo": ("trl", "DPOConfig"),
    "kto": ("trl", "KTOConfig"),
    "orpo": ("trl.experimental.orpo", "ORPOConfig"),
    "cpo": ("trl.experimental.cpo", "CPOConfig"),
}
_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


@dataclass(frozen=True)
class RunShape:
    """What sizes one training step's memory (counts in elements or tokens, sizes in bytes per element)."""

    algorithm: str
    batch: int  # rows per micro-batch (per_device_train_batch_size; pairs for DPO/ORPO/CPO)
    grad_accum: int
    generation_rows: int  # rows generated at once (online: batch x steps_per_generation)
    num_generations: int
    prompt_length: int
    completion_length: int
    weight_bytes: int  # per weight element (4-bit layers are counted apart)
    act_bytes: int  # per activation element (16-bit under autocast or 16-bit weights)
    checkpointing: bool | str  # False | True | "offload"
    num_chunks: int  # slimrl_num_chunks (-1: automatic)
    lora: bool
    load_in_4bit: bool
    reference: str  # "none" | "adapter" (LoRA disabled: no copy) | "copy" (a second model)
    scoring_forwards: int  # no-grad forwards over the generation batch per generation (old policy, reference)
    ref_forward: bool  # offline: a no-grad reference forward every micro-step
    entropy_grad: bool  # the loss differentiates the entropy (a second backward buffer)
    fast_inference: bool
    engine_fraction: float  # the vLLM engine's share of the device memory (gpu_memory_utilization)
    shared_prefix: bool
    device: str  # "cpu" | "cuda"
    group_rows: int = 0  # rows one policy forward and backward holds (row groups; 0: the whole micro-batch)
    tiled_mlp: bool | str | int = False  # the tiled-MLP setting (slimrl.planning.levers resolves its shard)
    rows_per_group: bool | str | int = False  # the row-groups setting group_rows was resolved from
    padding_free: bool | str = False  # the padding-free setting (not in the peak: rows are counted at full length)

    @property
    def offload_moves(self) -> bool:
        """Whether the mode's offload moves block inputs to host memory (a CUDA run's "offload")."""
        return resolve_checkpointing(asked=self.checkpointing, device=self.device).moves

    @property
    def policy_rows(self) -> int:
        """Rows of one policy forward and backward: a row group, or the whole micro-batch."""
        return self.group_rows or self.batch


def config_defaults(algorithm: str) -> dict:
    """TRL's dataclass defaults of the algorithm's config (no instance is built)."""
    import importlib

    module, name = CONFIG_CLASSES[algorithm]
    cls = getattr(importlib.import_module(module), name)
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def algorithm_of(config) -> str | None:
    name = type(config).__name__.lower()
    return next((algo for algo in CONFIG_CLASSES if name == f"{algo}config"), None)


def dtype_bytes(dtype) -> int:
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _fields(algorithm: str, config, overrides: dict) -> dict:
    values = config_defaults(algorithm)
    if isinstance(config, dict):
        values.update(config)
    elif config is not None:
        values.update({f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        values.update({k: v for k, v in vars(config).items() if k in fields.NAMES})  # set beside the dataclass
    values.update(overrides)
    return values


def _lengths(algorithm: str, f: dict, prompt_length, max_seq_length) -> tuple[int, int]:
    if algorithm in ONLINE:
        completion = int(f["max_completion_length"])
        if prompt_length is None:
            prompt_length = max(max_seq_length - completion, 1) if max_seq_length else 512
        return int(prompt_length), completion
    total = int(f.get("max_length") or 1024)
    if prompt_length is None:
        prompt_length = total // 2
    return int(prompt_length), max(total - int(prompt_length), 1)


def run_shape(
    algorithm: str,
    config=None,
    *,
    prompt_length=None,
    max_seq_length=None,
    dtype=None,
    lora=True,
    load_in_4bit=False,
    use_gradient_checkpointing=None,
    fast_inference=False,
    gpu_memory_utilization=0.5,
    device="cpu",
    **overrides,
) -> RunShape:
    f = _fields(algorithm, config, overrides)
    weight_bytes = dtype_bytes(dtype or ("bfloat16" if device == "cuda" else "float32"))
    autocast = (f.get("bf16") or f.get("fp16")) and weight_bytes == 4
    checkpointing = resolve_checkpointing(  # as the trainer will: get_peft_model's mode is the model's mark
        mark=None if use_gradient_checkpointing is None else normalize_mode(use_gradient_checkpointing),
        trl_offloading=bool(f.get("activation_offloading")),  # offline configs only have it
        **config_inputs(f),
    )
    prompt, completion = _lengths(algorithm, f, prompt_length, max_seq_length)
    batch, accum = int(f["per_device_train_batch_size"]), int(f.get("gradient_accumulation_steps") or 1)
    beta = float(f.get("beta") or 0.0)
    reference = (
        "none"
        if algorithm in NO_REFERENCE or (algorithm in ONLINE and beta == 0.0)
        else ("adapter" if lora else "copy")
    )
    spg = int(f.get("steps_per_generation") or accum) if algorithm in ONLINE else 1
    iterations = int(f.get("num_iterations") or 1)
    old_logps = algorithm == "rloo" or (algorithm in ONLINE and (accum % (spg * iterations) != 0 or fast_inference))
    shared = f.get(fields.SHARED_PREFIX, False)
    rows_setting, tiled_setting = levers.settings(algorithm, f)
    return RunShape(
        algorithm=algorithm,
        batch=batch,
        grad_accum=accum,
        generation_rows=batch * spg,
        num_generations=int(f.get("num_generations") or 1),
        prompt_length=prompt,
        completion_length=completion,
        weight_bytes=weight_bytes,
        act_bytes=2 if autocast else weight_bytes,
        checkpointing=checkpointing.mode,
        num_chunks=int(fields.default(fields.NUM_CHUNKS) if f.get(fields.NUM_CHUNKS) is None else f[fields.NUM_CHUNKS]),
        lora=lora,
        load_in_4bit=load_in_4bit,
        reference=reference,
        scoring_forwards=(int(old_logps) + int(reference != "none")) if algorithm in ONLINE else 0,
        ref_forward=algorithm not in ONLINE and reference != "none" and not f.get("precompute_ref_log_probs"),
        entropy_grad=float(f.get("entropy_coef") or 0.0) != 0.0,
        fast_inference=fast_inference,
        engine_fraction=float(gpu_memory_utilization) if fast_inference else 0.0,
        shared_prefix=shared is True,
        device=device,
        group_rows=levers.group_rows(rows_setting, batch, prompt + completion, device),
        tiled_mlp=tiled_setting,
        rows_per_group=rows_setting,
        padding_free=levers.padding_free_setting(algorithm, f),
    )
