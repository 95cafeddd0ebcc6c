"""The memory planner against measured peaks: three GRPO/DPO runs of real-ish shape on random
models, each dominated by a different term, planned within 25% of the peak RSS of their steady steps (slow tier:
each run is its own process, 1-5 minutes on 2 cores).

    head     GRPO, LoRA, V=128,256 (Llama-3's vocabulary), slimrl_num_chunks=1: the log-prob head's tiles
    weights  DPO, full fine-tuning of a 60M-parameter model: weights, reference copy, AdamW state, gradients
    kv       GRPO, LoRA, 64 rows x 512 tokens generated at once, checkpointing on: the rollout's KV cache

Measured on CPU as each optimizer step's peak RSS (VmHWM, reset by the harness when a step begins, rollouts included;
steps after the first; one thread; the machine may be shared: RSS barely depends on load). Negative control: the head
run planned with the chunk knob left automatic (128 MiB of tiles instead of 1 GiB) is far outside the tolerance, so the
check can fail.
"""

import pytest

import _measure_step as M

TOLERANCE = 0.25
CONFIGS = {
    "head": {
        "algorithm": "grpo",
        "model": {"vocab_size": 128256, "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
        "lora": {"r": 16},
        "prompt_length": 32,
        "completion_length": 128,
        "steps": 3,
        "config": {
            "per_device_train_batch_size": 8,
            "num_generations": 8,
            "gradient_accumulation_steps": 1,
            "slimrl_num_chunks": 1,
        },
    },
    "weights": {
        "algorithm": "dpo",
        "model": {
            "vocab_size": 32000,
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_layers": 8,
            "num_heads": 8,
            "num_kv_heads": 8,
        },
        "lora": None,
        "prompt_length": 64,
        "completion_length": 64,
        "steps": 3,
        "config": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1},
    },
    "kv": {
        "algorithm": "grpo",
        "checkpointing": True,
        "model": {
            "vocab_size": 8192,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_layers": 8,
            "num_heads": 4,
            "num_kv_heads": 4,
        },
        "lora": {"r": 16},
        "prompt_length": 64,
        "completion_length": 448,
        "steps": 1,
        "config": {
            "per_device_train_batch_size": 8,
            "num_generations": 8,
            "gradient_accumulation_steps": 8,
            "steps_per_generation": 8,
        },
    },
}
DOMINANT = {"head": "log-prob head (forward)", "weights": None, "kv": "KV cache"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_plan_is_within_25_percent_of_the_measured_peak(name, tmp_path):
    spec = {**CONFIGS[name], "output_dir": str(tmp_path / name)}
    planned = M.plan_for(spec, device_memory_gb=64)
    measured = M.measure(spec)["peak_bytes"]
    ratio = planned.peak_bytes / measured
    print(f"{name}: measured {measured / 2**30:.3f} GiB, planned {planned.peak_gb:.3f} GiB, ratio {ratio:.2f}")
    assert abs(ratio - 1) <= TOLERANCE, (name, measured, planned.peak_bytes)
    if name == "weights":  # weights + reference + AdamW + gradients are most of what is above the runtime
        parts = planned.terms()
        big = sum(parts[k] for k in ("weights", "reference copy", "optimizer state", "gradients"))
        assert big > (planned.peak_bytes - parts["runtime"]) / 2
    else:
        terms = {t.name: t.bytes for ts in planned.phases.values() for t in ts}
        assert max(terms, key=terms.get) == DOMINANT[name]
    if name == "head":  # negative control: a plan that misses the knob is caught by the same tolerance
        wrong = M.plan_for({**spec, "config": {**spec["config"], "slimrl_num_chunks": -1}}, device_memory_gb=64)
        assert abs(wrong.peak_bytes / measured - 1) > TOLERANCE
