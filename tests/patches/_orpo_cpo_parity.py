"""Shared harness for the stock-vs-patched parity tests of TRL's experimental ORPO and CPO trainers.

Same scheme as _pref_parity (DPO/KTO): the sides of _parity (stock, patched, float64 reference and perturbed
reference) on identical models, each built and run in its own state; each side draws its micro-batches from its own
dataloader after the same seed, runs the trainer's own `training_step` (TRL's compute_loss ->
get_batch_loss_metrics -> concatenated_forward), then the same plain SGD step. Compared: batches (exact), loss of
every micro-step, accumulated gradients, final parameters, and every metric ORPO/CPO store for logging
(`_stored_metrics["train"]`; the patched side may add `peak_memory_gb`, the set-up's metric).

The data has prompts, chosen and rejected answers of different lengths (both sides padded differently), and the
batch size (3) is not a power of two. The SGD step is large enough to move the log-probs visibly between steps.
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

# The harness's SGD step. Full fine-tuning moves every weight, so it takes a smaller one (as the other harnesses):
# at 0.05, full-FT CPO-IPO's first step grew the next gradient 30x (norm 4e2 -> 1e4) and saturated the softmax, so
# float32 errors of 1e-5 relative came from a few saturated tokens on any machine (_parity, point 4).
SGD_LR, FULL_FT_SGD_LR = 0.05, 0.01
EXTRA_PATCHED_METRICS = {"peak_memory_gb"}

PROMPTS = [*T.PROMPTS, "write the product of 6 and 7"]  # the same prompts as the DPO/KTO harness
GOOD = ["7", "the answer is 19 .", "hello", "8 times 9 is 72 and that is the final result", "eight", "yes", "42 ."]
BAD = ["8 or 9 or maybe 10", "no", "good bye world and thanks", "71", "i think it is many numbers", "no no", "6"]


def trl_classes(algorithm: str):
    if algorithm == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return ORPOConfig, ORPOTrainer
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    return CPOConfig, CPOTrainer


def dataset(n: int = 9):
    from datasets import Dataset

    rows = range(n)
    return Dataset.from_dict(
        {
            "prompt": [PROMPTS[i % len(PROMPTS)] for i in rows],
            "chosen": [GOOD[i % len(GOOD)] for i in rows],
            "rejected": [BAD[i % len(BAD)] for i in rows],
        }
    )


def make_config(algorithm: str, output_dir: str, **overrides):
    config_cls, _ = trl_classes(algorithm)
    kw = dict(
        output_dir=output_dir,
        **T.PARITY_CONFIG,
        max_length=48,
    )
    kw.update(overrides)
    return config_cls(**kw)


def build_trainer(algorithm: str, model, args, peft_config=None, train_dataset=None):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=train_dataset or dataset(),
        processing_class=T.tokenizer(),
        peft_config=copy.deepcopy(peft_config),
    )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def build_sides(
    algorithm: str,
    model_factory,
    config_kwargs: dict,
    output_dir: str,
    peft_config=None,
    patched_config: dict | None = None,
    data=dataset,
) -> Sides:
    """The sides' trainers on identical models; `data()` builds each side's own dataset (default: explicit prompts)."""
    trainers = {}
    for side in Sides._fields:
        with side_state(side, algorithm):
            extra = (patched_config or {}) if side == "patched" else {}
            args = make_config(algorithm, output_dir, **{**config_kwargs, **extra})
            model = side_model(side, model_factory)
            trainers[side] = finish_side(side, build_trainer(algorithm, model, args, peft_config, data()))
    return Sides(**trainers)


def run_side(trainer, optimizer_steps: int = 2, lr: float | None = None, seed: int = 1234) -> Trace:
    if lr is None:
        lr = SGD_LR if hasattr(trainer.model, "peft_config") else FULL_FT_SGD_LR
    trace = Trace()
    ga = trainer.args.gradient_accumulation_steps
    torch.manual_seed(seed)
    epoch_iterator = iter(trainer.get_train_dataloader())
    for _ in range(optimizer_steps):
        batches, num_items = trainer.get_batch_samples(epoch_iterator, ga, trainer.args.device)
        assert len(batches) == ga, "the dataset is too small for the requested steps"
        for batch in batches:
            trace.inputs.append({k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
            loss = trainer.training_step(trainer.model, batch, num_items)
            trace.losses.append(float(loss))
            trace.grads.append(
                {n: p.grad.detach().clone() for n, p in trainable(trainer.model).items() if p.grad is not None}
            )
        sgd_step(trainer, lr)
    trace.params = {n: p.detach().clone() for n, p in trainable(trainer.model).items()}
    trace.metrics = {k: list(v) for k, v in trainer._stored_metrics["train"].items()}
    return trace


def run_sides(algorithm: str, trainers: Sides, **kwargs) -> Sides:
    traces = {}
    for side, trainer in zip(Sides._fields, trainers):
        with side_state(side, algorithm):
            traces[side] = run_side(trainer, **kwargs)
    return Sides(**traces)


def assert_traces_match(traces: Sides) -> None:
    assert_inputs_match(traces)
    assert_steps_match(traces)
    assert_metrics_match(traces, EXTRA_PATCHED_METRICS)


def lora_config(**overrides):
    return T.lora_config(**overrides)
