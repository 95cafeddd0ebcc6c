"""The child side of bench/gpu_memory.py for stock TRL and slimrl: one arm of one configuration, in its own process
(the Unsloth arm: bench/_gpu_unsloth.py; what all arms share: bench/_gpu_measure.py).

Arms, each a way a user would run the same GRPO training (LoRA r=16, alpha 32, on all seven projections; bf16;
gradient checkpointing on; `rows` completions of one prompt per optimizer step; the same pinned config):
* "stock": TRL 1.16 as shipped, LoRA through `peft_config`.
* "stock-offload": the same with transformers' own activation offload,
  `gradient_checkpointing_kwargs={"use_reentrant": False, "offload": True}` (one flag any stock user can set).
* "stock-ga8": the same with `per_device_train_batch_size = rows / 8`, `gradient_accumulation_steps=8` (the same
  rows per optimizer step, scored a slice at a time: what a stock user tunes by hand).
* "slimrl": slimrl as a user gets it: `PatchFastRL("grpo")`, LoRA through `FastLanguageModel.get_peft_model` with
  slimrl's defaults (its default targets are these seven projections; its default checkpointing mode), the same
  config; every slimrl config field left at its default.
* "slimrl-offload": the same with `use_gradient_checkpointing="unsloth"` (offload), as Unsloth-style scripts write.
* "slimrl-no-long-context" (not in the presets; name it in --arms): "slimrl" with row groups, padding-free scoring
  and the tiled MLP switched off (`slimrl_rows_per_group=False`, ...): beside "slimrl", what those levers save.
* "slimrl-no-lora-levers" (not in the presets): "slimrl" with its LoRA speed levers off (`fused_lora=False,
  skip_lora_input_casts=False` to get_peft_model): beside "slimrl", what the fused LoRA forward and the skipped input
  casts save (docs/gpu-and-benchmarks.md, "LoRA speed levers").
* "stock-liger": "stock" with TRL's own `use_liger_kernel=True` (CUDA and the liger-kernel package only).
* The speed levers one at a time (get_peft_model's keywords `skip_lora_input_casts`, `fused_lora`, `liger_kernel`):
  "slimrl-no-speed-levers" has all three off; "slimrl-only-cast-skip", "slimrl-only-fused-lora" and
  "slimrl-only-liger" turn one on (True, not "auto") and the others off. A slimrl whose get_peft_model does not name
  `liger_kernel` runs the others without it (`levers_unavailable` in the row) and skips "slimrl-only-liger";
  "slimrl-only-liger" and "stock-liger" need CUDA (`NEEDS_CUDA`): skipped elsewhere, with the reason in the row.
Models are random weights of Qwen2.5 shapes built in place (no download), seeded, bf16 on CUDA (fp32 on CPU):
every arm trains the same model. Tokenizer: `slimrl.testing.tiny_tokenizer(V)` (a word-level tokenizer with V ids).
"""

from __future__ import annotations

import importlib.util
import inspect
import tempfile

from _gpu_measure import (
    ACCUMULATION,
    LORA,
    LORA_TARGETS,
    MODELS,
    PROMPT,
    ArmSkipped,
    Meter,
    checksum_reward,
    grpo_fields,
    profiler,
    qwen_config,
    run_measured,
    synthetic_rollouts,
)

ARMS = ("stock", "stock-offload", "stock-ga8", "slimrl", "slimrl-offload", "slimrl-no-long-context")
ARMS += ("slimrl-no-lora-levers", "stock-liger", "slimrl-no-speed-levers")
SPEED_LEVERS = {"cast-skip": "skip_lora_input_casts", "fused-lora": "fused_lora", "liger": "liger_kernel"}
SPEED_LEVERS_OFF = dict.fromkeys(SPEED_LEVERS.values(), False)
ARMS += tuple(f"slimrl-only-{lever}" for lever in SPEED_LEVERS)
NEEDS_CUDA = {
    "stock-liger": "TRL's use_liger_kernel runs Liger's Triton kernels: CUDA only",
    "slimrl-only-liger": "slimrl applies Liger-Kernel (liger_kernel=True) on CUDA only",
    "unsloth": "Unsloth needs CUDA",
    "unsloth-ga8": "Unsloth needs CUDA",
}
LONG_CONTEXT_OFF = {"slimrl_rows_per_group": False, "slimrl_padding_free": False, "slimrl_tiled_mlp": False}
LORA_LEVERS_OFF = {"fused_lora": False, "skip_lora_input_casts": False}
STOCK_OFFLOAD = {"gradient_checkpointing_kwargs": {"use_reentrant": False, "offload": True}}


def build_model(name: str, device: str, max_positions: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            qwen_config(name, max_positions), dtype=dtype, attn_implementation="sdpa"
        )
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model


def accepted_keywords() -> set[str]:
    """The keywords slimrl's get_peft_model names (FastLanguageModel's or models/lora.py's signature)."""
    from slimrl import FastLanguageModel
    from slimrl.models import lora

    names = set()
    for function in (FastLanguageModel.get_peft_model, lora.get_peft_model):
        names |= {p.name for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD}
    return names


def lever_options(arm: str, accepted: set[str]) -> tuple[dict, list[str]]:
    """(get_peft_model's speed-lever keywords for `arm`, the levers this slimrl lacks); ArmSkipped for an arm whose
    one lever is missing."""
    if arm == "slimrl-no-lora-levers":
        wanted = dict(LORA_LEVERS_OFF)
    elif arm == "slimrl-no-speed-levers":
        wanted = dict(SPEED_LEVERS_OFF)
    elif arm.startswith("slimrl-only-"):
        wanted = dict(SPEED_LEVERS_OFF, **{SPEED_LEVERS[arm.removeprefix("slimrl-only-")]: True})
    else:
        return {}, []
    missing = sorted(k for k in wanted if k not in accepted)
    if arm.startswith("slimrl-only-") and SPEED_LEVERS[arm.removeprefix("slimrl-only-")] in missing:
        raise ArmSkipped(f"slimrl's get_peft_model has no {SPEED_LEVERS[arm.removeprefix('slimrl-only-')]} keyword")
    return {k: v for k, v in wanted.items() if k not in missing}, missing


def prepare_arm(arm: str, algorithm: str, model) -> tuple[object, dict]:
    """(the model to train, the arm's extra trainer-config keywords, trainer keywords and notes for the row)."""
    from peft import LoraConfig

    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, not {arm!r}")
    if arm in NEEDS_CUDA and model.device.type != "cuda":
        raise ArmSkipped(f"{NEEDS_CUDA[arm]} (device {model.device.type})")
    if arm.startswith("slimrl"):
        from slimrl import FastLanguageModel, PatchFastRL

        options, missing = lever_options(arm, accepted_keywords())
        PatchFastRL(algorithm)
        if arm == "slimrl-offload":
            options["use_gradient_checkpointing"] = "unsloth"
        peft_model = FastLanguageModel.get_peft_model(
            model, r=LORA["r"], lora_alpha=LORA["lora_alpha"], lora_dropout=LORA["lora_dropout"], **options
        )
        extra = {"config": dict(LONG_CONTEXT_OFF)} if arm == "slimrl-no-long-context" else {}
        return peft_model, dict(extra, notes={"levers_unavailable": missing} if missing else {})
    if arm == "stock-liger" and importlib.util.find_spec("liger_kernel") is None:
        raise ArmSkipped("use_liger_kernel=True needs the liger-kernel package, not installed")
    config = {"stock-offload": STOCK_OFFLOAD, "stock-liger": {"use_liger_kernel": True}}.get(arm, {})
    lora = LoraConfig(**LORA, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)
    return model, {"config": dict(config), "trainer": {"peft_config": lora}}


def _split(extra: dict) -> tuple[dict, dict]:
    return extra.get("config", {}), extra.get("trainer", {})


def child_grpo(
    arm: str,
    model_name: str,
    length: int,
    rows: int,
    steps: int,
    rollouts: str,
    device: str,
    profile: bool = False,
    accumulation: int | None = None,
) -> dict:
    """One GRPO arm; `profile`: one more step, profiled (bench/_gpu_profile.py); `accumulation`: micro-batches per
    step (default: the arm's, ACCUMULATION)."""
    from datasets import Dataset

    from slimrl.testing import tiny_tokenizer

    record = {"kind": "grpo", "arm": arm, "model": model_name, "length": length, "rows": rows, "rollouts": rollouts}
    record["device_kind"] = device
    record["accumulation"] = accumulation or ACCUMULATION.get(arm, 1)
    meter = Meter(device)
    vocab = MODELS[model_name]["vocab_size"]
    base = build_model(model_name, device, max_positions=max(4096, 2 * length))
    if rollouts == "synthetic":
        synthetic_rollouts(base, length, vocab)
    elif rollouts != "generate":
        raise ValueError(f"rollouts must be 'synthetic' or 'generate', not {rollouts!r}")
    model, extra = prepare_arm(arm, "grpo", base)
    config_extra, trainer_extra = _split(extra)
    if rollouts == "generate":
        config_extra["generation_kwargs"] = {"min_new_tokens": length}
    from trl import GRPOConfig, GRPOTrainer

    fields = grpo_fields(length, rows, steps + int(profile), device, record["accumulation"])
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="slimrl-gpu-bench-"), **fields, **config_extra)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=checksum_reward,
        args=args,
        processing_class=tiny_tokenizer(vocab),
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * (steps + 1)}),
        **trainer_extra,
    )
    record.update(extra.get("notes", {}), settings=slimrl_settings(trainer))
    return run_measured(trainer, meter, record, profiler=profiler(profile, steps, device))


def slimrl_settings(trainer) -> dict:
    """slimrl's config fields and the model's checkpointing mode as the trainer runs them (empty for stock)."""
    args = trainer.args
    fields = {k: v for k, v in vars(args).items() if k.startswith("slimrl_")}
    try:
        from slimrl.models.checkpointing import checkpointing_mode

        fields["checkpointing_mode"] = checkpointing_mode(trainer.model)
    except ImportError:
        pass
    try:
        from slimrl.models.lora_speed import levers_on

        fields["lora_levers"] = levers_on(trainer.model)
    except ImportError:
        pass
    fields["gradient_checkpointing_kwargs"] = args.gradient_checkpointing_kwargs
    return {k: v if isinstance(v, (bool, int, float, str, type(None), dict)) else repr(v) for k, v in fields.items()}


def child_preference(
    arm: str, trainer_name: str, model_name: str, length: int, pairs: int, steps: int, device: str
) -> dict:
    """DPO / ORPO (any of preference_memory's trainers) on rows of exactly `length` tokens, `pairs` pairs per step."""
    from preference_memory import make_dataset, trl_classes
    from tokenizers import pre_tokenizers

    from slimrl.testing import tiny_tokenizer

    record = {"kind": "pref", "arm": arm, "trainer": trainer_name, "model": model_name, "length": length, "rows": pairs}
    record["device_kind"] = device
    meter = Meter(device)
    model, extra = prepare_arm(arm, trainer_name, build_model(model_name, device, max_positions=max(4096, length)))
    config_extra, trainer_extra = _split(extra)
    config_cls, trainer_cls = trl_classes(trainer_name)
    vocab = MODELS[model_name]["vocab_size"]
    tok = tiny_tokenizer(vocab)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # one token per filler word
    args = config_cls(
        output_dir=tempfile.mkdtemp(prefix="slimrl-gpu-bench-"),
        per_device_train_batch_size=pairs,
        max_steps=steps,
        max_length=length,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        learning_rate=1e-4,
        seed=0,
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        gradient_checkpointing=True,
        **config_extra,
    )
    trainer = trainer_cls(
        model=model,
        args=args,
        processing_class=tok,
        train_dataset=make_dataset(trainer_name, tok, vocab, length, pairs, steps),
        **trainer_extra,
    )
    return run_measured(trainer, meter, record)
