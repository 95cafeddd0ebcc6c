"""What every arm of bench/gpu_memory.py shares, and nothing that imports slimrl (the Unsloth arm runs in an
environment of its own, with Unsloth's TRL): model shapes, the pinned GRPO config, synthetic rollouts, the reward,
the peak reading and the timed run.

The peak, read the same way in every arm, over the whole run, and reset by no one:
* CUDA: `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` at the end of the child process (fresh, so
  the whole run: model build, trainer set-up, every step), plus the device's used memory (total minus
  `torch.cuda.mem_get_info`'s free, polled every 20 ms: the CUDA context and anything outside PyTorch's allocator
  included; nvidia-smi's figure, without nvidia-smi). `resident` is what was allocated when training began.
* CPU (the smoke run): VmHWM, the process's peak resident set, read at the end.
* Host: `host_rss_peak` (VmHWM) in every arm, CUDA too: offloaded activations live in host memory.

Timing: every step's wall seconds are kept (`step_times`); `s_per_step` is the median of the timed steps (all but the
first, a warm-up, and a profiled last step, which bench/_gpu_profile.py slows down), `s_per_step_mean` their mean.
"""

from __future__ import annotations

import statistics
import threading
import time
import types

from _common import step_timer

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0)
MODELS = {  # Qwen2.5 shapes; "8b" is Qwen2.5-7B (7.6B parameters, the "8B-class"); "smoke" a CPU toy
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
ACCUMULATION = {"stock-ga8": 8, "unsloth-ga8": 8}  # arms scoring one row per micro-batch, 8 micro-batches a step
FILLER_START = 200  # ids above the tokenizer's named tokens (specials, symbols, words)
PROMPT = "what is the sum of 3 and 4 ? think step by step and answer"
# GRPO fields every arm passes explicitly (TRL 1.16's defaults, tests/bench checks them), so no library's own
# defaults (Unsloth rewrites some) change the training: the same config in every arm.
GRPO_PINNED = dict(
    loss_type="dapo",
    beta=0.0,
    epsilon=0.2,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    repetition_penalty=1.0,
    num_iterations=1,
    scale_rewards="group",
    mask_truncated_completions=False,
    importance_sampling_level="token",
    disable_dropout=False,
    use_vllm=False,
    shuffle_dataset=True,
    cast_lm_head_to_fp32=False,
    lr_scheduler_type="linear",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
    optim="adamw_torch_fused",
    gradient_checkpointing=True,
)


class ArmSkipped(Exception):
    """An arm that cannot run here (no CUDA, a package or keyword missing): its row says why, nothing runs."""


def qwen_config(name: str, max_positions: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        **MODELS[name],
        max_position_embeddings=max_positions,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )


def grpo_fields(length: int, rows: int, steps: int, device: str, accumulation: int = 1) -> dict:
    """The GRPO config of every arm: `rows` completions of one prompt per optimizer step, in micro-batches of
    rows / accumulation."""
    return dict(
        GRPO_PINNED,
        per_device_train_batch_size=rows // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=rows,
        max_completion_length=length,
        max_steps=steps,
        learning_rate=1e-5,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=device == "cpu",
        bf16=device == "cuda",
    )


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


class DeviceUsedPoller:
    """Peak of the device's used memory (total - free), polled every 20 ms in a thread."""

    def __init__(self, torch):
        self.torch, self.peak, self._running = torch, 0, True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while self._running:
            free, total = self.torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(0.02)

    def stop(self) -> int:
        self._running = False
        self._thread.join()
        free, total = self.torch.cuda.mem_get_info()
        return max(self.peak, total - free)


class Meter:
    """The whole run's peaks (module docstring). Start it before the model is built."""

    def __init__(self, device: str):
        import torch

        self.cuda, self.torch = device == "cuda", torch
        self.poller = DeviceUsedPoller(torch) if self.cuda else None
        self.resident = None

    def mark_resident(self) -> None:
        self.resident = self.torch.cuda.memory_allocated() if self.cuda else _status_bytes("VmRSS")

    def read(self) -> dict:
        host = _status_bytes("VmHWM")
        if not self.cuda:
            return {
                "peak": host,
                "reserved": None,
                "device_used": None,
                "resident": self.resident,
                "host_rss_peak": host,
            }
        cuda = self.torch.cuda
        return {
            "host_rss_peak": host,
            "peak": cuda.max_memory_allocated(),
            "reserved": cuda.max_memory_reserved(),
            "device_used": self.poller.stop(),
            "resident": self.resident,
            "device_total": cuda.get_device_properties(0).total_memory,
        }


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def environment(device: str, packages=("torch", "transformers", "trl", "peft", "accelerate")) -> dict:
    import importlib
    import platform

    import torch

    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "python": platform.python_version()}
    for name in packages:
        try:
            out[name] = importlib.import_module(name).__version__
        except ImportError:
            out[name] = None
    return out


def profiler(profile: bool, steps: int, device: str):
    """bench/_gpu_profile.py's callback for the extra step after `steps` (None without --profile)."""
    if not profile:
        return None
    from _gpu_profile import profile_callback

    return profile_callback(steps, device == "cuda")


def timing(times: list[float], profiled: bool = False) -> dict:
    """The median and mean of the timed steps: all but the warm-up (the first) and a profiled last step."""
    timed = times[1 : len(times) - 1 if profiled else None] or times
    return {
        "step_times": times,
        "warmup_steps": 1 if len(times) > 1 else 0,
        "timed_steps": len(timed),
        "s_per_step": statistics.median(timed) if timed else None,
        "s_per_step_mean": sum(timed) / len(timed) if timed else None,
    }


def run_measured(
    trainer, meter: Meter, record: dict, packages=("torch", "transformers", "trl", "peft"), profiler=None
) -> dict:
    """`trainer.train()` with step times and peaks; an out-of-memory error becomes `oom: True` (nothing raised).
    profiler: a callback of bench/_gpu_profile.py (its step's breakdown goes to the row's `profile`)."""
    import torch

    timer = step_timer()
    trainer.add_callback(timer)
    if profiler is not None:
        trainer.add_callback(profiler)
    record = dict(record, trainer_class=type(trainer).__name__, **environment(record["device_kind"], packages))
    meter.mark_resident()
    start = time.perf_counter()
    try:
        trainer.train()
    except torch.OutOfMemoryError as exc:
        return dict(record, oom=True, error=str(exc).splitlines()[0], **meter.read())
    logs = trainer.state.log_history
    profiled = {"profile": profiler.result} if profiler is not None and profiler.result else {}
    return dict(
        record,
        oom=False,
        steps=len(timer.times),
        **timing(timer.times, profiled=bool(profiled)),
        **profiled,
        wall=time.perf_counter() - start,
        losses=[h["loss"] for h in logs if "loss" in h],
        mean_length=[h["completions/mean_length"] for h in logs if "completions/mean_length" in h],
        **meter.read(),
    )
