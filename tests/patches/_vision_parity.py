"""Parity harness of GRPO and DPO with image prompts on tiny random image-text models (slimrl.testing_vision).

The sides and the tolerance rule are _parity's; the lock-step loops are _rl_parity's (GRPO: the trainer's own
`training_step` on one generation batch, torch reseeded per micro-step) and _pref_parity's (DPO: each side's own
dataloader). What differs from the text harnesses: every side gets its own model of the same family and seed (float64
copies on the reference sides), the family's processor as `processing_class`, and rows whose prompt shows a drawn
picture (`image` column, a few distinct pictures, each prompt repeated `num_generations` times by TRL's sampler).
"""

from __future__ import annotations

import copy

import torch

from slimrl.testing_vision import draw_shapes, tiny_processor, tiny_vlm

import _harness as HS
import _pref_parity as PP
import _rl_parity as R
from _parity import Sides, finish_side, side_model, side_state

QUESTIONS = ["how many squares ?", "what colour are the squares ?", "count the shapes"]
COLOURS = ("red", "blue", "green")
GOOD, BAD = [" three", " red squares", " two"], [" one or many", " blue", " no idea at all"]


def picture(i: int):
    return draw_shapes(i % 3 + 1, COLOURS[i % 3], size=32, seed=i)


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[i % 3]}]}]


def grpo_rows(n: int) -> list[dict]:
    return [{"prompt": prompt(i), "image": picture(i)} for i in range(n)]


def dpo_dataset(n: int = 6):
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": prompt(i),
                "image": picture(i),
                "chosen": [{"role": "assistant", "content": GOOD[i % 3]}],
                "rejected": [{"role": "assistant", "content": BAD[i % 3]}],
            }
            for i in range(n)
        ]
    )


def model_factory(kind: str):
    return lambda: tiny_vlm(kind)[0]


def _build(algorithm, side, kind, config_kwargs, output_dir, peft_config, patched_config):
    import trl

    extra = dict(patched_config or {}) if side == "patched" else {}
    model = side_model(side, model_factory(kind))
    torch.manual_seed(0)  # TRL creates LoRA adapters from peft_config with the global RNG
    if algorithm == "grpo":
        from datasets import Dataset

        args = R.make_config("grpo", output_dir, **{**config_kwargs, **extra})
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=R.reward_ids,
            args=args,
            train_dataset=Dataset.from_list(grpo_rows(6)),
            processing_class=tiny_processor(kind),
            peft_config=copy.deepcopy(peft_config),
        )
    else:
        args = PP.make_config("dpo", output_dir, **{"max_length": None, **config_kwargs, **extra})
        trainer = trl.DPOTrainer(
            model=model,
            args=args,
            train_dataset=dpo_dataset(),
            processing_class=tiny_processor(kind),
            peft_config=copy.deepcopy(peft_config),
        )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return finish_side(side, trainer)


def build_sides(algorithm, kind, config_kwargs, output_dir, peft_config=None, patched_config=None) -> Sides:
    trainers = {}
    for side in Sides._fields:
        with side_state(side, algorithm):
            trainers[side] = _build(algorithm, side, kind, config_kwargs, output_dir, peft_config, patched_config)
    return Sides(**trainers)


def generation_batch(args) -> list[dict]:
    """Each prompt `num_generations` times in a row, as TRL's RepeatSampler lays them out."""
    n_prompts = args.per_device_train_batch_size * args.steps_per_generation // args.num_generations
    return [row for row in grpo_rows(n_prompts) for _ in range(args.num_generations)]


def run_sides(algorithm: str, trainers: Sides, optimizer_steps: int = 2, seed: int = 1234) -> Sides:
    if algorithm == "dpo":
        return PP.run_sides("dpo", trainers, optimizer_steps=optimizer_steps)
    gen_batch = generation_batch(trainers.stock.args)
    traces = Sides(*(R.Trace() for _ in Sides._fields))
    for step in range(optimizer_steps):
        for micro in range(trainers.stock.args.gradient_accumulation_steps):
            for side, trainer, trace in zip(Sides._fields, trainers, traces):
                with side_state(side, algorithm):
                    R.micro_step(trainer, gen_batch, seed + 100 * step + micro, trace)
        for trainer in trainers:
            R.sgd_step(trainer, R.SGD_LR)
    for trainer, trace in zip(trainers, traces):
        HS.finish_trace(trace, trainer, trainer._metrics["train"])
    return traces


def assert_traces_match(algorithm: str, traces: Sides) -> None:
    (PP if algorithm == "dpo" else R).assert_traces_match(traces)
