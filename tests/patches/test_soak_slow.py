"""Soak (slow tier: `bash scripts/test.sh -m slow`): 200 patched GRPO steps on a tiny model with a reward function that
fails on ~5% of completions under slimrl_reward_errors="skip". The run completes, failures show in the logged metric
(rewards/<name>/errors: on some steps, not on most, never more than the batch), and memory stays flat: the mean
peak_memory_gb (the process's RSS high-water mark at each step's end, never reset) of the last 50 steps is within 5%
of the first 50's: memory that grew from step to step would raise the mark."""

import random

import pytest

from slimrl import PatchFastRL

import _rl_parity as R
import _tiny as T

STEPS, FAILURE_RATE = 200, 0.05


@pytest.mark.slow
def test_200_steps_with_a_flaky_reward(tmp_path, unpatched):
    rng = random.Random(0)
    failures = []

    def flaky_length(completions, **kwargs):
        rewards = []
        for completion in completions:
            if rng.random() < FAILURE_RATE:
                failures.append(completion)
                raise RuntimeError("the grader timed out")
            rewards.append(len(completion) / 10)
        return rewards

    PatchFastRL("grpo")
    args = R.make_config(
        "grpo",
        str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        slimrl_reward_errors="skip",
        learning_rate=1e-3,
    )
    trainer = R.trl_classes("grpo")[1](
        model=T.tiny_model(),
        reward_funcs=[flaky_length],
        args=args,
        train_dataset=R.dataset(64),
        processing_class=T.tokenizer(),
        peft_config=T.lora_config(),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "peak_memory_gb" in h]
    assert trainer.state.global_step == STEPS and len(logs) == STEPS
    errors = [h.get("rewards/flaky_length/errors", 0.0) for h in logs]
    assert 0 < sum(e > 0 for e in errors) < STEPS, "some steps saw a failure, most did not"
    # the metric averages each step's per-call counts; the total per step is at most the batch
    assert all(0 <= e <= 8 for e in errors)
    first, last = (sum(h["peak_memory_gb"] for h in part) / len(part) for part in (logs[:50], logs[-50:]))
    assert abs(last - first) <= 0.05 * first, f"memory grew: first 50 steps {first:.3f} GiB, last 50 {last:.3f} GiB"
