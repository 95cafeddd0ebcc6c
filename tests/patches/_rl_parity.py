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

import _harness as HS
import _tiny as T
from _harness import side_config  # tests and scripts/parity_spread.py call it as R.side_config
from _parity import Sides, Trace, finish_side, record_step_gradients, sgd_step, side_model, side_state

# The harness's own SGD step: large enough that the second step is clearly off-policy (ratios clip). Full
# fine-tuning moves every weight, so it gets a smaller step: at 0.1 VESPO's gamma weights collapse to ~0 on the
# second step and its loss becomes a cancellation of tiny terms.
SGD_LR, FULL_FT_SGD_LR = 0.1, 0.03
# GRPO/RLOO's own fields beside the shared parity arguments (_tiny.PARITY_CONFIG)
RL_CONFIG = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=7, disable_dropout=True)


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]  # GRPOConfig.loss_type's values


def loss_type_config(loss_type: str, sequence_level=("luspo",)) -> dict:
    """A GRPO case of `loss_type` with every forward live: KL to a reference (beta 0.04) and old-policy ratios
    (num_iterations 2). Sequence-level importance sampling for the types in `sequence_level` (LUSPO requires it)."""
    return dict(
        loss_type=loss_type,
        importance_sampling_level="sequence" if loss_type in sequence_level else "token",
        beta=0.04,
        num_iterations=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=7,
    )


def model_factory(kind: str, saved_model: str | None = None):
    """The cases' models: "memory" the tiny model, "saved" reloaded from `saved_model` (TRL rebuilds a full
    fine-tuning reference from its path), "peft_model" wrapped by the user (TRL copies the adapter as the frozen
    reference), "tied" with input and output embeddings shared."""
    if kind == "tied":  # lm_head shares the embedding matrix: its gradient arrives from the head and the lookup
        return lambda: T.tiny_model(0, tie_word_embeddings=True)
    if kind == "saved":
        return lambda: T.load_tiny(saved_model)
    if kind == "peft_model":
        return T.peft_model
    return lambda: T.tiny_model(0)


def enable_side_checkpointing(trainers: Sides, mode) -> None:
    """Transformers' own checkpointing on TRL's sides, slimrl's `mode` (True, "offload") on the patched one."""
    from slimrl.models.checkpointing import apply_checkpointing

    for side, trainer in zip(Sides._fields, trainers):
        if side == "patched":
            apply_checkpointing(trainer.model, mode)
        else:
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


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
    return HS.parity_config(trl_classes(algorithm)[0], output_dir, RL_CONFIG, overrides)


def build_trainer(
    algorithm: str, model, args, peft_config=None, seed: int = 0, train_dataset=None, tokenizer=None, **trainer_kwargs
):
    """`trainer_kwargs`: other arguments of the trainer (GRPO's tools, environment_factory, rollout_func)."""
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(seed)  # TRL creates LoRA adapters from peft_config with the global RNG
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_ids,
        args=args,
        train_dataset=train_dataset or dataset(),
        processing_class=tokenizer or T.tokenizer(),
        peft_config=copy.deepcopy(peft_config),
        **trainer_kwargs,
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
    patched_config: dict | None = None,
    trainer_kwargs: dict | None = None,
) -> Sides:
    """Stock, patched and reference trainers on the same weights; `num_chunks` and `patched_config` go to the patched
    config only (slimrl's fields); `trainer_kwargs` to every side's trainer (see `build_trainer`)."""

    def build_side(side: str):
        args = make_config(algorithm, output_dir, **side_config(side, config_kwargs, num_chunks, patched_config))
        model = side_model(side, model_factory)
        return build_trainer(algorithm, model, args, peft_config, **(trainer_kwargs or {}))

    return HS.build_each_side(algorithm, build_side)


def build_case(
    algorithm: str, tmp_path, kind: str, saved_model, config: dict, lora: bool, checkpointing=None, **patched
) -> Sides:
    """The sides of one parity case: the model of `kind` (`model_factory`), LoRA adapters from `peft_config` when
    `lora`, `patched` (`num_chunks`, `patched_config`) for the patched side's config, then `checkpointing` (True,
    "offload") as `enable_side_checkpointing` sets it."""
    peft_config = T.lora_config() if lora else None
    trainers = build_sides(algorithm, model_factory(kind, saved_model), config, str(tmp_path), peft_config, **patched)
    if checkpointing is not None:
        enable_side_checkpointing(trainers, checkpointing)
    return trainers


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
    trace.inputs.append(HS.tensors_of(buffered))
    trace.grads.append(HS.gradients_of(trainer.model))


def run_sides(
    algorithm: str,
    trainers: Sides,
    optimizer_steps: int = 2,
    lr: float | None = None,
    seed: int = 1234,
    gen_batch: list[dict] | None = None,
) -> Sides:
    """`optimizer_steps` steps on every side, in lock-step; each side's calls run in its own patch state.
    `gen_batch`: the generation batch's rows (default: `generation_batch` of the tiny prompts)."""
    lr = HS.sgd_lr(trainers.stock.model, SGD_LR, FULL_FT_SGD_LR) if lr is None else lr
    gen_batch = gen_batch or generation_batch(trainers.stock.args)
    traces = Sides(*(Trace() for _ in Sides._fields))
    for step in range(optimizer_steps):
        for micro in range(trainers.stock.args.gradient_accumulation_steps):
            for side, trainer, trace in zip(Sides._fields, trainers, traces):
                with side_state(side, algorithm):
                    micro_step(trainer, gen_batch, seed + 100 * step + micro, trace)
        for trainer in trainers:
            sgd_step(trainer, lr)
    for trainer, trace in zip(trainers, traces):
        HS.finish_trace(trace, trainer, trainer._metrics["train"])
    return traces


def assert_traces_match(traces: Sides) -> None:
    HS.assert_traces_match(traces)


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
    """Build and `train()` one side (a field of `Sides`); returns the trainer, with the gradients of each optimizer
    step in `trainer.step_gradients` (`_parity.record_step_gradients`)."""
    with side_state(side, algorithm):
        args = make_config(algorithm, output_dir, **side_config(side, config_kwargs, num_chunks))
        trainer = finish_side(
            side, build_trainer(algorithm, side_model(side, model_factory), args, peft_config, seed=seed)
        )
        trainer.step_gradients = record_step_gradients(trainer)
        trainer.train()
    return trainer
