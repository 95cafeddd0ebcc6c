"""What the trainer parity harnesses share (_pref_parity: DPO/KTO/SFT/reward, _orpo_cpo_parity, _online_parity,
_rl_parity): the sides' trainers built each in its own state, what a trace keeps of a micro-step, one side's run
through its own dataloader and `training_step` (the offline trainers), and the comparison of the sides' traces.
The comparison rule itself and the sides' states are _parity's."""

from __future__ import annotations

import copy

import torch

import _tiny as T
from _parity import (
    Sides,
    Trace,
    assert_inputs_match,
    assert_metrics_match,
    assert_step_gradients_match,
    assert_steps_match,
    check_sides,
    finish_side,
    sgd_step,
    side_state,
    trainable,
)


def build_each_side(algorithm: str, build_side) -> Sides:
    """One trainer per side: `build_side(side)` runs in the side's state, then _parity's `finish_side`."""
    trainers = {}
    for side in Sides._fields:
        with side_state(side, algorithm):
            trainers[side] = finish_side(side, build_side(side))
    return Sides(**trainers)


def tiny_sides(build_sides, algorithm: str, config: dict, output_dir, lora: bool, num_chunks, factory=None, **kwargs):
    """A parity harness's `build_sides` on `factory`'s models (default: the tiny model, seed 0), with the tiny LoRA
    config where `lora` (else full fine-tuning) and `num_chunks` for the patched side; `kwargs` as that harness
    takes them."""
    factory, peft_config = factory or (lambda: T.tiny_model(0)), T.lora_config() if lora else None
    return build_sides(algorithm, factory, config, str(output_dir), peft_config, num_chunks=num_chunks, **kwargs)


def side_config(side: str, config_kwargs: dict, num_chunks=None, patched_config=None) -> dict:
    """The config of one side: the case's kwargs, plus slimrl's own fields on the patched side only."""
    if side != "patched":
        return dict(config_kwargs)
    extra = {} if num_chunks is None else {"slimrl_num_chunks": num_chunks}
    return {**config_kwargs, **extra, **(patched_config or {})}


def parity_config(config_cls, output_dir: str, defaults: dict, overrides: dict):
    """A harness's config: the shared parity arguments (_tiny.PARITY_CONFIG), the harness's `defaults`, then
    `overrides` (which win)."""
    return config_cls(**{"output_dir": output_dir, **T.PARITY_CONFIG, **defaults, **overrides})


def sgd_lr(model, lora_lr: float, full_ft_lr: float) -> float:
    """The harness's SGD step for `model`: full fine-tuning moves every weight, so it takes the smaller one."""
    return lora_lr if hasattr(model, "peft_config") else full_ft_lr


def tensors_of(batch: dict) -> dict[str, torch.Tensor]:
    """The tensors of a micro-batch, copied (what a trace keeps of the inputs)."""
    return {k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}


def gradients_of(model) -> dict[str, torch.Tensor]:
    """The accumulated gradients of the trainable parameters, copied."""
    return {n: p.grad.detach().clone() for n, p in trainable(model).items() if p.grad is not None}


def finish_trace(trace: Trace, trainer, metrics: dict) -> Trace:
    """After the run: the final trainable parameters and the metrics the trainer stored (`metrics`: key -> values)."""
    trace.params = {n: p.detach().clone() for n, p in trainable(trainer.model).items()}
    trace.metrics = {k: list(v) for k, v in metrics.items()}
    return trace


def build_offline_trainer(trainer_cls, model, args, peft_config, train_dataset, seed: int = 0):
    """An offline trainer (its own dataloader) on the tiny tokenizer; TRL creates LoRA adapters from `peft_config`
    with the global RNG, so it is seeded first."""
    torch.manual_seed(seed)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=train_dataset,
        processing_class=T.tokenizer(),
        peft_config=copy.deepcopy(peft_config),
    )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def run_dataloader_side(trainer, lr: float, metrics_attr: str, optimizer_steps: int, seed: int) -> Trace:
    """`optimizer_steps` steps of GA micro-steps drawn from the trainer's own dataloader after `seed` (counted by
    Trainer's `get_batch_samples`, as `Trainer.train` does), each through the trainer's own `training_step`, the
    harness's SGD step in between. `metrics_attr`: where the trainer stores its metrics (`_metrics`, ...)."""
    trace = Trace()
    ga = trainer.args.gradient_accumulation_steps
    torch.manual_seed(seed)
    epoch_iterator = iter(trainer.get_train_dataloader())
    for _ in range(optimizer_steps):
        batches, num_items = trainer.get_batch_samples(epoch_iterator, ga, trainer.args.device)
        assert len(batches) == ga, "the dataset is too small for the requested steps"
        for batch in batches:
            trace.inputs.append(tensors_of(batch))
            loss = trainer.training_step(trainer.model, batch, num_items)
            trace.losses.append(float(loss))
            trace.grads.append(gradients_of(trainer.model))
        sgd_step(trainer, lr)
    return finish_trace(trace, trainer, getattr(trainer, metrics_attr)["train"])


def run_each_side(algorithm: str, trainers: Sides, run_side, **kwargs) -> Sides:
    """Each side's whole run (`run_side(trainer, **kwargs)`) in its own state."""
    traces = {}
    for side, trainer in zip(Sides._fields, trainers):
        with side_state(side, algorithm):
            traces[side] = run_side(trainer, **kwargs)
    return Sides(**traces)


def assert_traces_match(traces: Sides, extra_patched_metrics=("peak_memory_gb",)) -> None:
    """The sides' inputs, steps and stored metrics by _parity's rule (the patched side may store
    `extra_patched_metrics` besides stock's)."""
    assert_inputs_match(traces)
    assert_steps_match(traces)
    assert_metrics_match(traces, extra_patched_metrics)


def assert_trained_sides_match(trainers: Sides, keys, steps: int = 2) -> None:
    """Sides trained by TRL's own `train()` for `steps` optimizer steps, each trainer's `step_gradients` recorded
    (_parity's record_step_gradients): the same gradients at every step, every key in `keys` logged `steps` times and
    the same on every side, `peak_memory_gb` logged by the patched side only, the same final trainable parameters."""
    assert_step_gradients_match(Sides(*(t.step_gradients for t in trainers)))
    for key in keys:
        logged = Sides(*(T.logged(t, key) for t in trainers))
        assert all(len(values) == steps for values in logged), key
        check_sides(f"logged {key}", logged)
    assert T.logged(trainers.patched, "peak_memory_gb") and not T.logged(trainers.stock, "peak_memory_gb")
    params = Sides(*(trainable(t.model) for t in trainers))
    assert all(p.keys() == params.stock.keys() for p in params)
    for name in params.stock:
        check_sides(f"final {name}", Sides(*(p[name].detach() for p in params)))


def largest_allocation(run) -> int:
    """Elements of the largest storage any op allocates (forward and backward) while `run()` runs. Views and in-place
    / `out=` results share an input's storage and are not allocations: skipped."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def storages(tree):
        return {t.untyped_storage().data_ptr() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = storages((args, kwargs))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
            return out

    with Largest() as mode:
        run()
    return mode.largest
