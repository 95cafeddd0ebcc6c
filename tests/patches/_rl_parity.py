"""Parity harness of TRL's online RL trainers (GRPO, RLOO): the sides of _parity in lock-step.

Choices, and why:
- Patches are class-level, so every call of a side runs inside its state (`_parity.side_state`): stock and
  reference unpatched, patched under `PatchFastRL(algorithm)`; `unpatch()` always runs on exit. Each trainer keeps
  the head it was built with on its model instance.
- Same weights: each side gets its own model from the same factory and seed (the float64 sides a float64 copy;
  LoRA adapters created by TRL from `peft_config` are seeded too).
- Same rollouts: each micro-step reseeds torch before `training_step`, so all sides sample the same completions and
  shuffle the buffer the same way; the comparison checks this (ids and masks must be equal) and compares what each
  side computed with no grad through its own head (old / reference log-probs) by the tolerance rule of _parity.
- One optimizer step = `gradient_accumulation_steps` calls of the trainer's own `training_step` (TRL's
  `_prepare_inputs` buffering, `num_iterations`, `steps_per_generation`, loss normalisation all run), then a plain
  SGD step taken identically on every side. SGD (not Adam) keeps tiny float differences tiny after the step.
"""

from __future__ import annotations

import copy

import torch

import _tiny as T
from _parity import (
    Sides,
    Trace,
    assert_inputs_match,
    assert_metrics_match,
    assert_steps_match,
    finish_side,
    sgd_step,
    side_model,
    side_state,
    trainable,
)

# The harness's own SGD step: large enough that the second step is clearly off-policy (ratios clip). Full
# fine-tuning moves every weight, so it gets a smaller step: at 0.1 VESPO's gamma weights collapse to ~0 on the
# second step and its loss becomes a cancellation of tiny terms.
SGD_LR, FULL_FT_SGD_LR = 0.1, 0.03


def trl_classes(algorithm: str):
    import trl

    if algorithm == "gmpo":  # experimental: a GRPOTrainer subclass
        from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

        return GMPOConfig, GMPOTrainer
    return {"grpo": (trl.GRPOConfig, trl.GRPOTrainer), "rloo": (trl.RLOOConfig, trl.RLOOTrainer)}[algorithm]


def reward_ids(completions, completion_ids, **kwargs):
    """Deterministic reward with spread inside every group: token-id checksum plus a length term."""
    return [float(sum(ids) % 7) + 0.5 * len(ids) for ids in completion_ids]


def dataset(n: int = 6):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [T.PROMPTS[i % len(T.PROMPTS)] for i in range(n)]})


def make_config(algorithm: str, output_dir: str, **overrides):
    """A small CPU fp32 config; `overrides` win. Built in the current patch state (slimrl fields need the patch)."""
    config_cls, _ = trl_classes(algorithm)
    kw = dict(
        output_dir=output_dir,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=7,
        learning_rate=1e-2,
        gradient_checkpointing=False,
        seed=0,
        disable_dropout=True,
        dataloader_pin_memory=False,
    )
    kw.update(overrides)
    return config_cls(**kw)


def build_trainer(algorithm: str, model, args, peft_config=None, seed: int = 0, train_dataset=None):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(seed)  # TRL creates LoRA adapters from peft_config with the global RNG
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_ids,
        args=args,
        train_dataset=train_dataset or dataset(),
        processing_class=T.tokenizer(),
        peft_config=copy.deepcopy(peft_config),
    )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def side_config(side: str, config_kwargs: dict, num_chunks=None, patched_config=None) -> dict:
    """The config of one side: the case's kwargs, plus slimrl's own fields on the patched side only."""
    if side != "patched":
        return dict(config_kwargs)
    extra = {} if num_chunks is None else {"slimrl_num_chunks": num_chunks}
    return {**config_kwargs, **extra, **(patched_config or {})}


def build_sides(
    algorithm: str,
    model_factory,
    config_kwargs: dict,
    output_dir: str,
    peft_config=None,
    num_chunks: int | None = None,
    patched_config: dict | None = None,
) -> Sides:
    """Stock, patched and reference trainers on the same weights; `num_chunks` and `patched_config` go to the patched
    config only (slimrl's fields)."""
    trainers = {}
    for side in Sides._fields:
        with side_state(side, algorithm):
            args = make_config(algorithm, output_dir, **side_config(side, config_kwargs, num_chunks, patched_config))
            trainers[side] = finish_side(
                side, build_trainer(algorithm, side_model(side, model_factory), args, peft_config)
            )
    return Sides(**trainers)


def generation_batch(args) -> list[dict]:
    """One generation batch as TRL's RepeatSampler lays it out: each prompt `num_generations` times in a row."""
    size = args.per_device_train_batch_size * args.steps_per_generation
    n_prompts = size // args.num_generations
    return [{"prompt": T.PROMPTS[i % len(T.PROMPTS)]} for i in range(n_prompts) for _ in range(args.num_generations)]


def micro_step(trainer, gen_batch, seed: int, trace: Trace) -> None:
    torch.manual_seed(seed)
    step = trainer._step
    loss = trainer.training_step(trainer.model, gen_batch, None)
    trace.losses.append(float(loss))
    buffered = trainer._buffered_inputs[step % trainer.args.steps_per_generation]
    trace.inputs.append({k: v.detach().clone() for k, v in buffered.items() if isinstance(v, torch.Tensor)})
    trace.grads.append({n: p.grad.detach().clone() for n, p in trainable(trainer.model).items() if p.grad is not None})


def run_sides(
    algorithm: str, trainers: Sides, optimizer_steps: int = 2, lr: float | None = None, seed: int = 1234
) -> Sides:
    """`optimizer_steps` steps on every side, in lock-step; each side's calls run in its own patch state."""
    if lr is None:
        lr = SGD_LR if hasattr(trainers.stock.model, "peft_config") else FULL_FT_SGD_LR
    gen_batch = generation_batch(trainers.stock.args)
    traces = Sides(*(Trace() for _ in Sides._fields))
    for step in range(optimizer_steps):
        for micro in range(trainers.stock.args.gradient_accumulation_steps):
            for side, trainer, trace in zip(Sides._fields, trainers, traces):
                with side_state(side, algorithm):
                    micro_step(trainer, gen_batch, seed + 100 * step + micro, trace)
        for trainer in trainers:
            sgd_step(trainer, lr)
    for trainer, trace in zip(trainers, traces):
        trace.params = {n: p.detach().clone() for n, p in trainable(trainer.model).items()}
        trace.metrics = {k: list(v) for k, v in trainer._metrics["train"].items()}
    return traces


def assert_traces_match(traces: Sides) -> None:
    assert_inputs_match(traces)
    assert_steps_match(traces)
    assert_metrics_match(traces)


def train_side(
    algorithm: str,
    side: str,
    model_factory,
    config_kwargs: dict,
    output_dir: str,
    peft_config=None,
    num_chunks: int | None = None,
    seed: int = 0,
):
    """Build and `train()` one side (a field of `Sides`); returns the trainer."""
    with side_state(side, algorithm):
        args = make_config(algorithm, output_dir, **side_config(side, config_kwargs, num_chunks))
        trainer = finish_side(
            side, build_trainer(algorithm, side_model(side, model_factory), args, peft_config, seed=seed)
        )
        trainer.train()
    return trainer
