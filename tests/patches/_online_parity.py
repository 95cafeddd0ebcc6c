"""Parity harness of TRL 1.16's experimental online trainers without GRPO's buffer (OnlineDPO, A2PO): the six sides
of _parity in lock-step.

Choices, and why (as _rl_parity, whose conventions this follows):
- Each side's calls run in its own patch state; the float64 sides are stock TRL on a float64 copy of the weights,
  where these trainers' own `log_softmax` of full logits is already the naive float64 computation.
- Same rollouts: torch is reseeded before every `training_step` (and before A2PO's Stage 1), so all sides sample the
  same completions; the sampled ids and masks are recorded (the trainer's `_generate` / `_prepare_inputs` wrapped on
  the instance) and must be equal on every side; what a side computed from them with no grad (A2PO's reference
  log-probs) is compared by the tolerance rule.
- One optimizer step = `gradient_accumulation_steps` calls of the trainer's own `training_step`, then the harness's
  SGD step, identical on every side.
"""

from __future__ import annotations

import copy

import torch

import _harness as HS
import _tiny as T
from _parity import Sides, Trace, sgd_step, side_model, side_state

SGD_LR, FULL_FT_SGD_LR = 0.1, 0.03


def trl_classes(algorithm: str):
    if algorithm == "online_dpo":
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        return OnlineDPOConfig, OnlineDPOTrainer
    from trl.experimental.a2po import A2POConfig, A2POTrainer

    return A2POConfig, A2POTrainer


def reward_ids(completions, completion_ids, **kwargs):
    """Deterministic reward with spread between the two completions of a prompt."""
    return [float(sum(ids) % 7) + 0.5 * len(ids) for ids in completion_ids]


def binary_reward(completions, **kwargs):
    """A2PO assumes a binary (verifiable) reward: 1 when the completion's characters are odd in number."""
    return [float(len(str(c)) % 2) for c in completions]


def dataset(n: int = 6):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [T.PROMPTS[i % len(T.PROMPTS)] for i in range(n)]})


BASE_CONFIG = {
    "online_dpo": dict(max_new_tokens=7, max_length=64, beta=0.1),
    "a2po": dict(max_completion_length=7, max_prompt_length=32, num_value_samples=3, beta2=0.05),
}


def make_config(algorithm: str, output_dir: str, **overrides):
    return HS.parity_config(trl_classes(algorithm)[0], output_dir, BASE_CONFIG[algorithm], overrides)


def build_trainer(algorithm: str, model, args, peft_config=None, reward=None, seed: int = 0, **trainer_kwargs):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(seed)  # TRL creates LoRA adapters from peft_config with the global RNG
    if algorithm == "online_dpo":
        trainer_kwargs.setdefault("peft_config", copy.deepcopy(peft_config))
        if "judge" not in trainer_kwargs:
            trainer_kwargs["reward_funcs"] = reward if reward is not None else reward_ids
    else:
        trainer_kwargs["reward_funcs"] = reward if reward is not None else binary_reward
    trainer = trainer_cls(
        model=model, args=args, train_dataset=dataset(), processing_class=T.tokenizer(), **trainer_kwargs
    )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def build_sides(
    algorithm: str,
    model_factory,
    config_kwargs: dict,
    output_dir: str,
    peft_config=None,
    num_chunks: int | None = None,
    trainer_kwargs=None,
) -> Sides:
    """Six trainers on the same weights; `num_chunks` goes to the patched config only. `trainer_kwargs`: a callable
    (side -> extra trainer keywords), so each side gets its own reward model or judge."""

    def build_side(side: str):
        args = make_config(algorithm, output_dir, **HS.side_config(side, config_kwargs, num_chunks))
        kwargs = trainer_kwargs(side) if trainer_kwargs is not None else {}
        return build_trainer(algorithm, side_model(side, model_factory), args, peft_config, **kwargs)

    return HS.build_each_side(algorithm, build_side)


def record_rollouts(algorithm: str, trainer, trace: Trace) -> None:
    """Wrap the instance's rollout method so each micro-step's sampled ids (and A2PO's inputs) land in `trace`."""
    if algorithm == "online_dpo":
        generate = trainer._generate

        def recorded(*args, **kwargs):
            prompt_ids, prompt_mask, completion_ids, completion_mask, vision = generate(*args, **kwargs)
            trace.inputs.append(
                {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "completion_mask": completion_mask}
            )
            return prompt_ids, prompt_mask, completion_ids, completion_mask, vision

        trainer._generate = recorded
        return
    prepare = trainer._prepare_inputs

    def recorded_inputs(inputs):
        out = prepare(inputs)
        trace.inputs.append(HS.tensors_of(out))
        return out

    trainer._prepare_inputs = recorded_inputs


def metrics_of(trainer) -> dict:
    return trainer.stats if hasattr(trainer, "stats") else trainer._metrics["train"]


def estimate_values(algorithm: str, trainers: Sides, seed: int = 99) -> None:
    """A2PO's Stage 1 (V* from reference samples) on every side, same seed; the estimates must be equal."""
    if algorithm != "a2po":
        return
    for side, trainer in zip(Sides._fields, trainers):
        with side_state(side, algorithm):
            torch.manual_seed(seed)
            trainer._estimate_optimal_values()
    values = [t._optimal_values for t in trainers]
    assert all(v.keys() == values[0].keys() for v in values), "Stage 1 kept other prompts on some side"
    for key in values[0]:
        assert len({round(v[key], 9) for v in values}) == 1, f"V* of {key!r} differs between sides"


def batch_of(algorithm: str, trainer) -> object:
    """One micro-batch as the trainer's collator hands it over (OnlineDPO: a dict of columns; A2PO: the rows)."""
    prompts = [T.PROMPTS[i % len(T.PROMPTS)] for i in range(trainer.args.per_device_train_batch_size)]
    return {"prompt": prompts} if algorithm == "online_dpo" else [{"prompt": p} for p in prompts]


def run_sides(algorithm: str, trainers: Sides, optimizer_steps: int = 2, lr=None, seed: int = 1234) -> Sides:
    lr = HS.sgd_lr(trainers.stock.model, SGD_LR, FULL_FT_SGD_LR) if lr is None else lr
    traces = Sides(*(Trace() for _ in Sides._fields))
    estimate_values(algorithm, trainers)
    for trainer, trace in zip(trainers, traces):
        record_rollouts(algorithm, trainer, trace)
    batch = batch_of(algorithm, trainers.stock)
    for step in range(optimizer_steps):
        for micro in range(trainers.stock.args.gradient_accumulation_steps):
            for side, trainer, trace in zip(Sides._fields, trainers, traces):
                with side_state(side, algorithm):
                    torch.manual_seed(seed + 100 * step + micro)
                    loss = trainer.training_step(trainer.model, copy.deepcopy(batch), None)
                trace.losses.append(float(loss))
                trace.grads.append(HS.gradients_of(trainer.model))
        for trainer in trainers:
            sgd_step(trainer, lr)
    for trainer, trace in zip(trainers, traces):
        HS.finish_trace(trace, trainer, metrics_of(trainer))
    return traces


def assert_traces_match(traces: Sides) -> None:
    HS.assert_traces_match(traces)
