"""Child process: train a random model of a given shape for a few steps and print the peak RSS of the steady steps.

    python tests/training/_measure_step.py '<json spec>'      (prints one JSON line: the spec's measurements)

Spec keys: algorithm ("grpo" | "dpo"), model (tiny_llama_config keywords: vocab_size, hidden_size, num_layers, ...),
lora (None for full fine-tuning, else {"r": .., "target_modules": [..]}), prompt_length, completion_length, steps,
and TRL config fields under "config". Prompts are `prompt_length` words of the word-level tokenizer, so each is
exactly that many tokens; a random model almost never samples EOS, so every completion has `completion_length`.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _dataset(spec):
    from datasets import Dataset

    from slimrl.testing import _LETTERS, _WORDS

    words = _WORDS + _LETTERS  # one token each (digits would be split one per token)
    n, p = 64, spec["prompt_length"]
    prompts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(p)) for i in range(n)]
    if spec["algorithm"] == "grpo":
        return Dataset.from_dict({"prompt": prompts})
    c = spec["completion_length"]
    chosen = [" ".join(words[(i * 3 + j) % len(words)] for j in range(c)) for i in range(n)]
    rejected = [" ".join(words[(i * 5 + j) % len(words)] for j in range(c)) for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


def reset_peak_rss() -> None:
    """Start a new VmHWM reading (Linux): this harness measures each optimizer step's own peak RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _reward(completions, **kwargs):
    return [float(len(c) % 7) for c in completions]


def main(spec: dict) -> dict:
    import torch
    from transformers import TrainerCallback

    from slimrl import FastLanguageModel, PatchFastRL
    from slimrl.memory import peak_memory_bytes
    from slimrl.testing import tiny_llama, tiny_tokenizer

    algorithm = spec["algorithm"]
    PatchFastRL(algorithm)
    torch.manual_seed(0)
    vocab = spec["model"]["vocab_size"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = tiny_llama(dtype=dtype, **spec["model"])
    tokenizer = tiny_tokenizer(vocab)
    if not spec.get("lora") and algorithm != "grpo":  # TRL reloads a full fine-tuning reference by path
        folder = os.path.join(spec["output_dir"], "model")
        model.save_pretrained(folder)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    if spec.get("lora"):
        model = FastLanguageModel.get_peft_model(
            model, use_gradient_checkpointing=spec.get("checkpointing", False), **spec["lora"]
        )
    peaks = []

    class StepPeak(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            reset_peak_rss()

        def on_step_end(self, args, state, control, **kwargs):
            peaks.append(peak_memory_bytes("cpu"))

    common = dict(
        output_dir=spec["output_dir"],
        max_steps=spec.get("steps", 3),
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        learning_rate=1e-4,
        seed=0,
        gradient_checkpointing=bool(spec.get("checkpointing", False)),
        disable_tqdm=True,
    )
    common.update(spec.get("config", {}))
    if algorithm == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(max_completion_length=spec["completion_length"], **common)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=_reward,
            args=args,
            train_dataset=_dataset(spec),
            processing_class=tokenizer,
            callbacks=[StepPeak()],
        )
    else:
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(max_length=spec["prompt_length"] + spec["completion_length"], **common)
        trainer = DPOTrainer(
            model=model, args=args, train_dataset=_dataset(spec), processing_class=tokenizer, callbacks=[StepPeak()]
        )
    before = _rss()
    trainer.train()
    steady = peaks[1:] or peaks
    return {"peak_bytes": max(steady), "step_peaks": peaks, "rss_before_train": before}


def plan_for(spec: dict, **kwargs):
    """slimrl's plan for the run `main(spec)` measures (the same model config and TRL fields)."""
    from slimrl.planning import plan
    from slimrl.testing import tiny_llama_config

    fields = dict(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        bf16=False,
        gradient_checkpointing=bool(spec.get("checkpointing", False)),
    )
    fields.update(spec.get("config", {}))
    if spec["algorithm"] == "grpo":
        fields["max_completion_length"] = spec["completion_length"]
    else:
        fields["max_length"] = spec["prompt_length"] + spec["completion_length"]
    lora = spec.get("lora")
    return plan(
        tiny_llama_config(**spec["model"]),
        fields,
        spec["algorithm"],
        prompt_length=spec["prompt_length"],
        lora_r=lora["r"] if lora else None,
        lora_target_modules=(lora or {}).get("target_modules"),
        full_finetuning=not lora,
        dtype=spec.get("dtype", "float32"),
        device="cpu",
        use_gradient_checkpointing=spec.get("checkpointing", False),
        **kwargs,
    )


def measure(spec: dict, timeout: int = 1800) -> dict:
    """`main(spec)` in a fresh process (its own peak RSS), one torch thread."""
    import subprocess

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
