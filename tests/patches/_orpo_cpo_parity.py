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

import _harness as HS
import _tiny as T
from _parity import Sides, Trace, side_model
from _pref_parity import BAD, GOOD, PROMPTS  # the same prompts and answers as the DPO/KTO harness

# The harness's SGD step. Full fine-tuning moves every weight, so it takes a smaller one (as the other harnesses):
# at 0.05, full-FT CPO-IPO's first step grew the next gradient 30x (norm 4e2 -> 1e4) and saturated the softmax, so
# float32 errors of 1e-5 relative came from a few saturated tokens on any machine (_parity, point 4).
SGD_LR, FULL_FT_SGD_LR = 0.05, 0.01


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
    return HS.parity_config(trl_classes(algorithm)[0], output_dir, {"max_length": 48}, overrides)


def build_trainer(algorithm: str, model, args, peft_config=None, train_dataset=None):
    _, trainer_cls = trl_classes(algorithm)
    return HS.build_offline_trainer(trainer_cls, model, args, peft_config, train_dataset or dataset())


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

    def build_side(side: str):
        args = make_config(algorithm, output_dir, **HS.side_config(side, config_kwargs, patched_config=patched_config))
        return build_trainer(algorithm, side_model(side, model_factory), args, peft_config, data())

    return HS.build_each_side(algorithm, build_side)


def run_side(trainer, optimizer_steps: int = 2, lr: float | None = None, seed: int = 1234) -> Trace:
    lr = HS.sgd_lr(trainer.model, SGD_LR, FULL_FT_SGD_LR) if lr is None else lr
    return HS.run_dataloader_side(trainer, lr, "_stored_metrics", optimizer_steps, seed)


def run_sides(algorithm: str, trainers: Sides, **kwargs) -> Sides:
    return HS.run_each_side(algorithm, trainers, run_side, **kwargs)


def assert_traces_match(traces: Sides) -> None:
    HS.assert_traces_match(traces)


def lora_config(**overrides):
    return T.lora_config(**overrides)
