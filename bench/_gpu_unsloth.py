"""The Unsloth arm of bench/gpu_memory.py: Unsloth 2026.10.9 on the same GRPO training as the other arms, in its own
process and its own environment (Unsloth pins TRL <= 1.15 and rewrites TRL's trainers when imported).

* Environment: a folder made by `pip install --no-deps --target` from the wheels scripts/unsloth_wheels.sh downloads
  (unsloth, unsloth_zoo, trl 1.15.0, datasets 4.8.5), put first on the child's PYTHONPATH; slimrl's src/ is not on
  it and nothing of slimrl is imported. `unsloth` is imported before transformers, TRL and peft, as Unsloth asks.
  UNSLOTH_DISABLE_STATISTICS=1, UNSLOTH_ENABLE_LOGGING=1 (what it chose goes to the child's log), HF_HUB_OFFLINE=1.
* Model: Unsloth loads models by path, so the parent writes a folder once per model (`write_model_folder`): the
  Qwen2.5-shaped config, the arms' tokenizer, and a weights file holding only the final norm; every other weight is
  missing and transformers initialises it at random on load, on the GPU (its usual path for missing weights). Memory
  and time do not depend on the values.
* Loading and LoRA, every choice pinned: 16-bit LoRA (`load_in_4bit=False, load_in_16bit=True`), bf16,
  `fast_inference=False` (HF generate: the rollouts are synthetic anyway), `fix_tokenizer=False` (the arms'
  tokenizer unchanged), `unsloth_tiled_mlp=False` (its default), `use_gradient_checkpointing="unsloth"` (its default:
  offload), r=16, alpha 32, dropout 0, the seven projections, `random_state=3407`.
* Config: grpo_fields (GRPO_PINNED plus the run's sizes), each passed explicitly; fields TRL 1.15 lacks are dropped
  and listed. After the trainer is built, every pinned field Unsloth changed is recorded (`unsloth_changed`), with
  Unsloth's own fields (`unsloth_*`: its row-group size and logit chunking, chosen at run time when None), the
  trainer's class (an Unsloth trainer proves its rewrite ran) and its version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from _gpu_measure import (
    ACCUMULATION,
    LORA,
    LORA_TARGETS,
    MODELS,
    PROMPT,
    Meter,
    checksum_reward,
    grpo_fields,
    qwen_config,
    run_measured,
    synthetic_rollouts,
)

ENVIRONMENT = {"UNSLOTH_DISABLE_STATISTICS": "1", "UNSLOTH_ENABLE_LOGGING": "1", "HF_HUB_OFFLINE": "1"}
LOADING = dict(
    load_in_4bit=False,
    load_in_8bit=False,
    load_in_16bit=True,
    full_finetuning=False,
    fast_inference=False,
    fix_tokenizer=False,
    unsloth_tiled_mlp=False,
    use_gradient_checkpointing="unsloth",
    random_state=3407,
)
MAX_POSITIONS = 1 << 20  # one folder serves every length the search probes


def write_model_folder(model_name: str, folder: str) -> str:
    """The folder Unsloth loads (module docstring); written once, reused. Runs in slimrl's environment."""
    import torch
    from safetensors.torch import save_file

    from slimrl.testing import tiny_tokenizer

    marker = os.path.join(folder, "bench-model.json")
    if os.path.exists(marker):
        return folder
    os.makedirs(folder, exist_ok=True)
    config = qwen_config(model_name, MAX_POSITIONS)
    config.save_pretrained(folder)
    tiny_tokenizer(MODELS[model_name]["vocab_size"]).save_pretrained(folder)
    save_file({"model.norm.weight": torch.ones(config.hidden_size)}, os.path.join(folder, "model.safetensors"))
    with open(marker, "w") as f:
        json.dump({"model": model_name, "shapes": MODELS[model_name]}, f)
    return folder


def _pinned_config(GRPOConfig, fields: dict) -> tuple[dict, list[str]]:
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {k: v for k, v in fields.items() if k in known}, sorted(k for k in fields if k not in known)


def _what_unsloth_chose(args, asked: dict) -> dict:
    changed = {k: [v, getattr(args, k)] for k, v in asked.items() if getattr(args, k, v) != v}
    own = {k: getattr(args, k) for k in vars(args) if k.startswith("unsloth")}
    return {"unsloth_changed": changed, "unsloth_fields": {k: _plain(v) for k, v in own.items()}}


def _plain(value):
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def child_unsloth(
    model_name: str, length: int, rows: int, steps: int, folder: str, device: str, arm: str = "unsloth", profiler=None
) -> dict:
    """arm "unsloth" (`rows` per micro-batch) or "unsloth-ga8" (one row per micro-batch, 8 micro-batches a step)."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    import unsloth  # first: Unsloth patches transformers, TRL and peft when imported
    from unsloth import FastLanguageModel

    record = {"kind": "grpo", "arm": arm, "model": model_name, "length": length, "rows": rows}
    import torch
    from datasets import Dataset

    record.update(rollouts="synthetic", device_kind=device, unsloth=unsloth.__version__, loading=LOADING)
    meter = Meter(device)
    model, tokenizer = FastLanguageModel.from_pretrained(
        folder, max_seq_length=length + 64, dtype=torch.bfloat16 if device == "cuda" else torch.float32, **LOADING
    )
    vocab = MODELS[model_name]["vocab_size"]
    synthetic_rollouts(model, length, vocab)
    model = FastLanguageModel.get_peft_model(
        model,
        target_modules=LORA_TARGETS,
        bias="none",
        use_gradient_checkpointing=LOADING["use_gradient_checkpointing"],
        random_state=LOADING["random_state"],
        **LORA,
    )
    synthetic_rollouts(model, length, vocab)  # the wrapper too: Unsloth may route generate through it
    from trl import GRPOConfig, GRPOTrainer

    asked, dropped = _pinned_config(GRPOConfig, grpo_fields(length, rows, steps, device, ACCUMULATION.get(arm, 1)))
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="slimrl-gpu-bench-"), **asked)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=checksum_reward,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * (steps + 1)}),
    )
    record.update(_what_unsloth_chose(trainer.args, asked), dropped_fields=dropped)
    return run_measured(
        trainer, meter, record, packages=("torch", "transformers", "trl", "peft", "unsloth_zoo"), profiler=profiler
    )
