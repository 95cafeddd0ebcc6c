"""Shared harness for the stock-vs-patched parity tests of TRL's experimental ORPO and CPO trainers.

Same scheme as _pref_parity (DPO/KTO): two trainers on identical models, the stock one built and run unpatched, the
patched one under `PatchFastRL(algorithm)`; each side draws its micro-batches from its own dataloader after the same
seed, runs the trainer's own `training_step` (TRL's compute_loss -> get_batch_loss_metrics -> concatenated_forward),
then the same plain SGD step. Compared: batches (exact), loss of every micro-step, accumulated gradients, final
parameters, and every metric ORPO/CPO store for logging (`_stored_metrics["train"]`; the patched side may add
`peak_memory_gb` when slimrl's set-up patches are registered for the algorithm).

The data has prompts, chosen and rejected answers of different lengths (both sides padded differently), and the
batch size (3) is not a power of two. The SGD step is large enough to move the log-probs visibly between steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

try:
    from . import _parity as P
except ImportError:  # tests/patches is not a package
    import _parity as P

import torch

from slimrl.testing import tiny_tokenizer

VOCAB = P.VOCAB
RTOL = P.RTOL
SGD_LR = 0.05
EXTRA_PATCHED_METRICS = {"peak_memory_gb"}

PROMPTS = [*P.PROMPTS, "write the product of 6 and 7"]  # the same prompts as the DPO/KTO harness
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
    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in rows],
                              "chosen": [GOOD[i % len(GOOD)] for i in rows],
                              "rejected": [BAD[i % len(BAD)] for i in rows]})


def make_config(algorithm: str, output_dir: str, **overrides):
    config_cls, _ = trl_classes(algorithm)
    kw = dict(output_dir=output_dir, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
              per_device_train_batch_size=3, learning_rate=1e-2, gradient_checkpointing=False, seed=0,
              dataloader_pin_memory=False, max_length=48)
    kw.update(overrides)
    return config_cls(**kw)


def build_trainer(algorithm: str, model, args, peft_config=None, train_dataset=None):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(0)
    trainer = trainer_cls(model=model, args=args, train_dataset=train_dataset or dataset(),
                          processing_class=tiny_tokenizer(VOCAB), peft_config=copy.deepcopy(peft_config))
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def build_pair(algorithm: str, model_factory, config_kwargs: dict, output_dir: str, peft_config=None):
    with P.stock_state():
        stock = build_trainer(algorithm, model_factory(), make_config(algorithm, output_dir, **config_kwargs),
                              peft_config)
    with P.patched_state(algorithm):
        patched = build_trainer(algorithm, model_factory(), make_config(algorithm, output_dir, **config_kwargs),
                                peft_config)
    return stock, patched


@dataclass
class Trace:
    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    inputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=dict)


def run_side(trainer, optimizer_steps: int = 2, lr: float = SGD_LR, seed: int = 1234) -> Trace:
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
            trace.grads.append({n: p.grad.detach().clone() for n, p in P.trainable(trainer.model).items()
                                if p.grad is not None})
        P.sgd_step(trainer, lr)
    trace.params = {n: p.detach().clone() for n, p in P.trainable(trainer.model).items()}
    trace.metrics = {k: list(v) for k, v in trainer._stored_metrics["train"].items()}
    return trace


def run_pair(algorithm: str, stock, patched, **kwargs) -> tuple[Trace, Trace]:
    with P.stock_state():
        s = run_side(stock, **kwargs)
    with P.patched_state(algorithm):
        p = run_side(patched, **kwargs)
    return s, p


def assert_traces_match(stock: Trace, patched: Trace, rtol: float = RTOL, metric_atol: float = 1e-6) -> float:
    """Everything equal within `rtol`; returns the largest relative metric difference seen (for the report)."""
    assert len(stock.losses) == len(patched.losses)
    for i, (s_in, p_in) in enumerate(zip(stock.inputs, patched.inputs)):
        assert s_in.keys() == p_in.keys(), f"micro-step {i}: batch keys {sorted(s_in)} != {sorted(p_in)}"
        for key in s_in:
            assert torch.equal(s_in[key], p_in[key]), f"micro-step {i}: {key} differs (batches diverged)"
    P.assert_steps_match(stock, patched, rtol)
    assert stock.metrics, "stock logged no metric"
    assert set(stock.metrics) <= set(patched.metrics) <= set(stock.metrics) | EXTRA_PATCHED_METRICS, (
        sorted(stock.metrics), sorted(patched.metrics))
    worst = 0.0
    for key, values in stock.metrics.items():
        got = patched.metrics[key]
        assert len(got) == len(values) == len(stock.losses), key
        for i, (vs, vp) in enumerate(zip(values, got)):
            assert abs(vp - vs) <= rtol * abs(vs) + metric_atol, f"metric {key}[{i}]: patched {vp!r} != stock {vs!r}"
            worst = max(worst, abs(vp - vs) / max(abs(vs), 1e-30))
    return worst


def lora_config(**overrides):
    return P.lora_config(**overrides)
