"""Patched RLOOTrainer ≡ stock TRL 1.16 RLOOTrainer: same rollouts, old/ref log-probs, loss, gradients, parameters.

RLOO always computes old log-probs with an extra no-grad forward and, with its default beta=0.05, reference
log-probs too (KL as a reward penalty), so every case runs the head with and without grad. Cases: LoRA from
`peft_config` (adapter-disabled reference), a user-wrapped PeftModel (TRL's frozen "ref" adapter), full fine-tuning
with a reference reloaded from disk, full fine-tuning without reference; plus reuse (num_iterations), gradient
accumulation, mask_truncated_completions, temperature, normalize_advantages and slimrl_num_chunks -1 / 1 / 3.
"""

import pytest
import torch

import _harness as HS
import _rl_parity as R
import _tiny as T

ALGO = "rloo"


CASES = {
    # RLOO's defaults (beta=0.05) with LoRA from peft_config: reference = adapter disabled
    "lora-default-beta-chunks3": ("memory", True, 3, dict(per_device_train_batch_size=4, num_generations=2)),
    # full fine-tuning, reference reloaded from `config._name_or_path`; reuse, batch of 6 in triples
    "full-ref-iters2-normadv-chunks1": (
        "saved",
        False,
        1,
        dict(
            num_iterations=2,
            normalize_advantages=True,
            per_device_train_batch_size=6,
            num_generations=3,
            max_completion_length=9,
        ),
    ),
    # no reference; accumulation, truncated completions masked, temperature
    "full-beta0-ga2-masktrunc-temp-auto": (
        "memory",
        False,
        -1,
        dict(
            beta=0.0,
            gradient_accumulation_steps=2,
            mask_truncated_completions=True,
            temperature=0.7,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=5,
        ),
    ),
    # user-wrapped PeftModel: TRL copies the adapter as a frozen "ref" adapter; asymmetric clip, checkpointing
    "peftmodel-refadapter-checkpointing-chunks3": (
        "peft_model",
        False,
        3,
        dict(
            epsilon_high=0.28,
            gradient_checkpointing=True,
            num_iterations=2,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rloo_parity(tmp_path, unpatched, saved_model, case):
    kind, lora, chunks, config = CASES[case]
    factory = {
        "saved": lambda: T.load_tiny(saved_model),
        "peft_model": T.peft_model,
        "memory": lambda: T.tiny_model(0),
    }[kind]
    trainers = HS.tiny_sides(R.build_sides, ALGO, config, tmp_path, lora, chunks, factory)
    stock, patched = trainers.stock, trainers.patched
    assert T.head_file(stock).endswith("trl/trainer/utils.py")
    assert T.head_file(patched).endswith("slimrl/ops/logprob.py")
    assert all((t.ref_model is None) == (kind != "saved") for t in trainers)
    traces = R.run_sides(ALGO, trainers)
    R.assert_traces_match(traces)
    s = traces.stock
    assert all("old_logps" in x for x in s.inputs)
    if lora:  # adapter-disabled base != policy; a reloaded or copied reference equals the policy until it moves
        assert max(stock._metrics["train"]["kl"]) > 0, "the KL penalty should be live (reference != policy)"
    if config.get("mask_truncated_completions"):
        masks = torch.cat([x["completion_mask"] for x in s.inputs])
        assert (masks.sum(1) == 0).any(), "the case should hold a truncated completion to mask"
        assert all(loss != 0 for loss in s.losses), "every micro-step should still train"
