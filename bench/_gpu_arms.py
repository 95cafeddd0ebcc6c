"""The child side of bench/gpu_memory.py: one arm (stock TRL or slimrl) of one configuration, in its own process.

Choices, and why:
* Models: random weights built in place from a `Qwen2Config` with Qwen2.5's shapes (no download): "1.5b" is
  Qwen2.5-1.5B (V=151,936, tied embeddings), "8b" is Qwen2.5-7B (7.6B parameters, V=152,064:
  "8B-class"), "smoke" a 2-layer toy for the CPU smoke run. On CUDA the weights are created on the GPU in bf16
  (`with torch.device("cuda")`), seeded, so every arm trains the same model.
* Tokenizer: `slimrl.testing.tiny_tokenizer(V)`, a word-level tokenizer with V ids (filler words "w<id>").
* Arms: "stock" = TRL 1.16 as shipped, TRL's default gradient checkpointing; "slimrl" = `PatchFastRL(...)`, the same
  config; "slimrl-offload" = that plus slimrl's "offload" checkpointing (`apply_checkpointing(model, "offload")`,
  what `use_gradient_checkpointing="unsloth"` does); "stock-offload" (opt-in) = stock TRL with transformers' own
  `gradient_checkpointing_kwargs={"offload": True}`. LoRA r=16 on all projections through `peft_config` in all arms.
* GRPO completions have exactly the requested length. `rollouts="generate"`: HF generate with
  `generation_kwargs={"min_new_tokens": length}` (EOS suppressed until the limit). `rollouts="synthetic"`: the model's
  `generate` is replaced by one that appends `length` seeded random ids (never EOS), identical in every arm; TRL's
  whole rollout path (`_generate_single_turn`, slimrl's for_inference/for_training around it) still runs. Autoregressive
  decoding of 8 x 8K tokens on the 8B model takes minutes per step and is the same code in both arms; synthetic
  rollouts measure the training side, where the arms differ, in minutes per step.
* Rewards are a deterministic function of the completion ids (same advantages, losses comparable across arms).
* Memory on CUDA: `torch.cuda.max_memory_allocated` / `max_memory_reserved` over the whole run (weights included);
  on CPU (smoke) the peak RSS (bench/_common.OverallPeak). An out-of-memory error is caught and reported as such.
"""

from __future__ import annotations

import tempfile
import time
import types

from _common import GiB, OverallPeak, step_timer

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODELS = {
    "1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
    "smoke": dict(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
}
ARMS = ("stock", "slimrl", "slimrl-offload", "stock-offload")
FILLER_START = 200  # ids above the tokenizer's named tokens (specials, symbols, words)
PROMPT = "what is the sum of 3 and 4 ? think step by step and answer"


def build_model(name: str, device: str, max_positions: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        **MODELS[name],
        max_position_embeddings=max_positions,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model


def prepare_arm(arm: str, algorithm: str, model) -> dict:
    """Patch TRL / set the model's checkpointing for `arm`; returns extra trainer-config keywords."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}")
    if arm.startswith("slimrl"):
        from slimrl.patches.registry import PatchFastRL

        PatchFastRL(algorithm)
    if arm == "slimrl-offload":
        from slimrl.models.checkpointing import apply_checkpointing

        apply_checkpointing(model, "offload")
    if arm == "stock-offload":
        return {"gradient_checkpointing_kwargs": {"use_reentrant": False, "offload": True}}
    return {}


def synthetic_rollouts(model, length: int, vocab: int, seed: int = 0) -> None:
    """Replace `model.generate` by one that appends `length` seeded random non-special ids to the prompts."""
    import torch

    generator = torch.Generator(device=model.device).manual_seed(seed)

    def generate(self, input_ids=None, **_ignored):
        new = torch.randint(
            FILLER_START, vocab, (input_ids.shape[0], length), device=input_ids.device, generator=generator
        )
        return torch.cat([input_ids, new], dim=1)

    model.generate = types.MethodType(generate, model)


def checksum_reward(completions, completion_ids, **_ignored) -> list[float]:
    return [float(sum(ids) % 7) for ids in completion_ids]


class Meter:
    """Peak memory of the run: CUDA allocator peaks, or peak RSS on CPU."""

    def __init__(self, device: str):
        import torch

        self.cuda, self.torch = device == "cuda", torch
        self.overall = None if self.cuda else OverallPeak()
        if self.cuda:
            self.resident = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    def read(self) -> dict:
        if not self.cuda:
            return {"peak": self.overall.stop(), "reserved": None, "resident": None}
        cuda = self.torch.cuda
        return {
            "peak": cuda.max_memory_allocated(),
            "reserved": cuda.max_memory_reserved(),
            "resident": self.resident,
            "device_total": cuda.get_device_properties(0).total_memory,
        }


def environment(device: str) -> dict:
    import torch
    import transformers
    import trl

    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }


def run_measured(trainer, meter: Meter, record: dict) -> dict:
    """`trainer.train()` with step times and peaks; an out-of-memory error becomes `oom: True` (nothing raised)."""
    import torch

    timer = step_timer()
    trainer.add_callback(timer)
    record = dict(record, **environment("cuda" if meter.cuda else "cpu"))
    start = time.perf_counter()
    try:
        trainer.train()
    except torch.OutOfMemoryError as exc:
        return dict(record, oom=True, error=str(exc).splitlines()[0], **meter.read())
    timed = timer.times[1:] or timer.times
    logs = trainer.state.log_history
    return dict(
        record,
        oom=False,
        steps=len(timer.times),
        s_per_step=sum(timed) / max(len(timed), 1),
        wall=time.perf_counter() - start,
        losses=[h["loss"] for h in logs if "loss" in h],
        mean_length=[h["completions/mean_length"] for h in logs if "completions/mean_length" in h],
        **meter.read(),
    )


def child_grpo(arm: str, model_name: str, length: int, rows: int, steps: int, rollouts: str, device: str) -> dict:
    from datasets import Dataset
    from peft import LoraConfig

    from slimrl.testing import tiny_tokenizer

    record = {"kind": "grpo", "arm": arm, "model": model_name, "length": length, "rows": rows, "rollouts": rollouts}
    model = build_model(model_name, device, max_positions=max(4096, 2 * length))
    extra = prepare_arm(arm, "grpo", model)
    from trl import GRPOConfig, GRPOTrainer

    vocab = MODELS[model_name]["vocab_size"]
    if rollouts == "synthetic":
        synthetic_rollouts(model, length, vocab)
    elif rollouts == "generate":
        extra["generation_kwargs"] = {"min_new_tokens": length}
    else:
        raise ValueError(f"rollouts must be 'synthetic' or 'generate', not {rollouts!r}")
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-gpu-bench-"),
        per_device_train_batch_size=rows,
        num_generations=rows,
        max_completion_length=length,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        learning_rate=1e-5,
        seed=0,
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        gradient_checkpointing=True,
        **extra,
    )
    lora = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)
    meter = Meter(device)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=checksum_reward,
        args=args,
        processing_class=tiny_tokenizer(vocab),
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * (steps + 1)}),
        peft_config=lora,
    )
    return run_measured(trainer, meter, record)


def child_preference(
    arm: str, trainer_name: str, model_name: str, length: int, pairs: int, steps: int, device: str
) -> dict:
    """DPO / ORPO (any of preference_memory's trainers) on rows of exactly `length` tokens, `pairs` pairs per step."""
    from peft import LoraConfig
    from preference_memory import make_dataset, trl_classes
    from tokenizers import pre_tokenizers

    from slimrl.testing import tiny_tokenizer

    record = {"kind": "pref", "arm": arm, "trainer": trainer_name, "model": model_name, "length": length, "rows": pairs}
    model = build_model(model_name, device, max_positions=max(4096, length))
    extra = prepare_arm(arm, trainer_name, model)
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
        **extra,
    )
    lora = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=LORA_TARGETS)
    meter = Meter(device)
    trainer = trainer_cls(
        model=model,
        args=args,
        processing_class=tok,
        peft_config=lora,
        train_dataset=make_dataset(trainer_name, tok, vocab, length, pairs, steps),
    )
    return run_measured(trainer, meter, record)


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GiB:.2f}"
