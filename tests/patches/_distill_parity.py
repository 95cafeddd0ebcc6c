"""Parity harness of TRL's distillation trainers (experimental GKD and GOLD, stable Distillation): the sides of
_parity in lock-step.

Choices, and why:
- Each side gets its own student and teacher from the same factories and seeds (the float64 sides float64 copies);
  the teacher is a separate, wider random model with the student's vocabulary, or the student's own base with its
  adapter disabled (`slimrl.base_as_teacher`, one base in memory), on every side alike.
- GKD and GOLD: each side draws its micro-batches from its own dataloader after the same seed and runs the
  trainer's own `training_step` (GKD's on-policy draw `random.random() <= lmbda` and its student / teacher
  generation, GOLD's buffered draws and generation); Python's and torch's RNGs are reseeded before every micro-step,
  so every side draws the same on-policy flags and samples the same completions; the comparison checks this (ids,
  masks and labels equal on every side). Distillation: as the GRPO harness, one generation batch of prompts per
  optimizer step, reseeded before every micro-step.
- The float64 reference: GKD / GOLD compute their loss on full logits with TRL's own `generalized_jsd_loss`, which
  in float64 is the reference as it stands. DistillationTrainer's TRL kernel computes in float32 whatever the
  weights, so its reference sides swap `_chunked_divergence_loss` for the same math on full float64 logits
  (`naive_divergence_loss`). The perturbed sides perturb the teacher too (its forward rounds in float32 on stock).
- One optimizer step = `gradient_accumulation_steps` micro-steps, then the same plain SGD step on every side.
  Compared: inputs of every micro-step, losses, accumulated gradients, final parameters, and every metric the trainer
  stored (the patched side adds `peak_memory_gb`).
"""

from __future__ import annotations

import copy
import inspect
import random
from contextlib import contextmanager

import torch

from slimrl.patches.trainers.distillation import compact_divergence_loss, trl_reduction
from slimrl.testing import tiny_llama

import _tiny as T
from _parity import (
    FLOAT64_SIDES,
    PERTURBATION_SEEDS,
    Sides,
    Trace,
    assert_inputs_match,
    assert_steps_match,
    check_sides,
    nudge_if_asked,
    sgd_step,
    side_state,
    trainable,
)
from _reference import perturb_rounding

SGD_LR, FULL_FT_SGD_LR = 0.05, 0.01
ANSWERS = ["7", "the answer is 19 .", "hello", "8 times 9 is 72 and that is the final result", "yes", "42 ."]


def trl_classes(algorithm: str):
    if algorithm == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        return GKDConfig, GKDTrainer
    if algorithm == "gold":
        from trl.experimental.gold import GOLDConfig, GOLDTrainer

        return GOLDConfig, GOLDTrainer
    import trl

    return trl.DistillationConfig, trl.DistillationTrainer


def student(seed: int = 0):
    return T.tiny_model(seed)


def wide_teacher(seed: int = 1):
    """A wider random model with the student's vocabulary (hidden 48 vs 32)."""
    model = tiny_llama(seed=seed, vocab_size=T.VOCAB, hidden_size=48, num_layers=T.LAYERS)
    with torch.no_grad():
        model.lm_head.weight[T.EOS_ID] *= T.EOS_BOOST
    return model


def lora_student(seed: int = 7):
    """The student as a PEFT model built before the trainer (its base can then serve as the teacher)."""
    from peft import get_peft_model

    model = student(0)
    torch.manual_seed(seed)
    return get_peft_model(model, T.lora_config())


def dataset(algorithm: str, n: int = 12):
    from datasets import Dataset

    prompts = [T.PROMPTS[i % len(T.PROMPTS)] for i in range(n)]
    if algorithm == "distillation":
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    answers = [ANSWERS[(3 * i) % len(ANSWERS)] for i in range(n)]
    messages = [[{"role": "user", "content": p}, {"role": "assistant", "content": a}] for p, a in zip(prompts, answers)]
    return Dataset.from_dict({"messages": messages})


def make_config(algorithm: str, output_dir: str, **overrides):
    config_cls, _ = trl_classes(algorithm)
    kw = dict(T.PARITY_CONFIG, output_dir=output_dir)
    if algorithm == "gkd":
        kw.update(max_length=48, max_new_tokens=6, lmbda=0.0)
    elif algorithm == "gold":
        # use_extended_uld (default True) tokenizes with byte offsets even without ULD: ByteLevel tokenizers only
        kw.update(max_length=48, max_completion_length=6, lmbda=0.0, use_extended_uld=False)
    else:
        kw.update(max_completion_length=7, per_device_train_batch_size=4)
    kw.update(overrides)
    return config_cls(**kw)


LOSS_CONTRACT = inspect.signature(compact_divergence_loss)  # TRL's `_chunked_divergence_loss`, as slimrl takes it


def naive_divergence_loss(*args, **kwargs):
    """DistillationTrainer's `_chunked_divergence_loss` contract (slimrl's compact_divergence_loss: its arguments,
    TRL's reduction) on full logits in the weights' dtype (float64)."""
    from trl.experimental.gkd import GKDTrainer

    bound = LOSS_CONTRACT.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    valid = a["completion_mask"].reshape(-1) != 0

    def logits(side: str):
        hidden, bias = a[f"{side}_hidden_states"], a[f"{side}_lm_head_bias"]
        z = torch.nn.functional.linear(hidden.reshape(-1, hidden.shape[-1])[valid], a[f"{side}_lm_head_weight"], bias)
        z, softcap = z * a[f"{side}_logit_scale"], a[f"{side}_final_logit_softcapping"]
        return z if softcap is None else softcap * torch.tanh(z / softcap)

    zs, zt = logits("student"), logits("teacher")
    temperature = a["temperature"]
    per_token = GKDTrainer.generalized_jsd_loss(zs, zt, beta=a["beta"], temperature=temperature, reduction="none")
    logp = torch.log_softmax(zs.detach() / temperature, -1)
    return trl_reduction(per_token.sum(-1), -(logp.exp() * logp).sum(-1), valid.sum(), a["num_items_in_batch"])


@contextmanager
def distill_side_state(side: str, algorithm: str):
    """_parity's side state, plus the full-logits float64 divergence on Distillation's float64 sides."""
    with side_state(side, algorithm):
        if algorithm != "distillation" or side not in FLOAT64_SIDES:
            yield
            return
        import trl.trainer.distillation_trainer as module

        saved = module._chunked_divergence_loss
        module._chunked_divergence_loss = naive_divergence_loss
        try:
            yield
        finally:
            module._chunked_divergence_loss = saved


def build_trainer(algorithm: str, model, teacher, args, peft_config=None):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=model,
        teacher_model=teacher,
        args=args,
        train_dataset=dataset(algorithm),
        processing_class=T.tokenizer(),
        peft_config=copy.deepcopy(peft_config),
    )
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def side_models(side: str, student_factory, teacher_factory):
    """(student, teacher) of one side; `teacher_factory` None: the student's base (`slimrl.base_as_teacher`)."""
    from slimrl.models.teacher import base_as_teacher

    model = student_factory()
    model = model.to(torch.float64) if side in FLOAT64_SIDES else model
    if teacher_factory is None:
        return model, base_as_teacher(model)
    teacher = teacher_factory()
    return model, teacher.to(torch.float64) if side in FLOAT64_SIDES else teacher


def build_sides(
    algorithm: str,
    config_kwargs: dict,
    output_dir: str,
    student_factory=student,
    teacher_factory=wide_teacher,
    peft_config=None,
    patched_config: dict | None = None,
) -> Sides:
    trainers = {}
    for side in Sides._fields:
        with distill_side_state(side, algorithm):
            extra = (patched_config or {}) if side == "patched" else {}
            args = make_config(algorithm, output_dir, **{**config_kwargs, **extra})
            model, teacher = side_models(side, student_factory, teacher_factory)
            trainer = build_trainer(algorithm, model, teacher, args, peft_config)
            if side in PERTURBATION_SEEDS:
                perturb_rounding(trainer.model, PERTURBATION_SEEDS[side])
                if teacher_factory is not None:  # a base teacher shares the student's (already perturbed) layers
                    perturb_rounding(trainer.teacher_model, PERTURBATION_SEEDS[side] + 1000)
            nudge_if_asked(side, trainer.model)  # a detection floor's deliberate change, as _parity.finish_side
            trainers[side] = trainer
    return Sides(**trainers)


def _reseed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _tensors(batch: dict) -> dict:
    return {k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}


def _grads(trainer) -> dict:
    return {n: p.grad.detach().clone() for n, p in trainable(trainer.model).items() if p.grad is not None}


def _micro_batches(algorithm: str, trainer, epoch_iterator):
    """The micro-batches of one optimizer step and `num_items_in_batch`, as `Trainer.train` passes them."""
    ga = trainer.args.gradient_accumulation_steps
    if algorithm == "distillation":
        size = trainer.args.per_device_train_batch_size * ga
        prompts = [{"prompt": [{"role": "user", "content": T.PROMPTS[i % len(T.PROMPTS)]}]} for i in range(size)]
        return [prompts] * ga, None
    return trainer.get_batch_samples(epoch_iterator, ga, trainer.args.device)


def _used_inputs(algorithm: str, trainer, batch, ids_before, step: int) -> dict:
    """What the micro-step trained on (GKD rewrites the batch in place, GOLD / Distillation buffer it), with
    `generated`: whether its completions were sampled in the step (GKD, GOLD: on-policy or teacher-generated)."""
    if algorithm == "gkd":
        return {**_tensors(batch), "generated": torch.tensor(batch["input_ids"] is not ids_before)}
    slot = step % trainer.args.gradient_accumulation_steps
    used = _tensors(trainer._buffered_inputs[slot])
    on_policy = True if algorithm == "distillation" else trainer._buffered_on_policy[slot]
    return {**used, "generated": torch.tensor(bool(on_policy))}


def run_sides(algorithm: str, trainers: Sides, optimizer_steps: int = 2, lr: float | None = None) -> Sides:
    """`optimizer_steps` steps on every side in lock-step, each side's calls in its own patch state."""
    if lr is None:
        lr = SGD_LR if hasattr(trainers.stock.model, "peft_config") else FULL_FT_SGD_LR
    traces = Sides(*(Trace() for _ in Sides._fields))
    iterators = {}
    for side, trainer in zip(Sides._fields, trainers):
        torch.manual_seed(1234)
        iterators[side] = iter(trainer.get_train_dataloader()) if algorithm != "distillation" else None
    for step in range(optimizer_steps):
        steps = {side: _micro_batches(algorithm, t, iterators[side]) for side, t in zip(Sides._fields, trainers)}
        for micro in range(trainers.stock.args.gradient_accumulation_steps):
            for side, trainer, trace in zip(Sides._fields, trainers, traces):
                batches, num_items = steps[side]
                batch = batches[micro] if algorithm == "distillation" else dict(batches[micro])
                with distill_side_state(side, algorithm):
                    _reseed(4321 + 100 * step + micro)
                    trl_step = getattr(trainer, "_step", 0)
                    ids_before = None if algorithm == "distillation" else batch["input_ids"]
                    loss = trainer.training_step(trainer.model, batch, num_items)
                trace.losses.append(float(loss))
                trace.inputs.append(_used_inputs(algorithm, trainer, batch, ids_before, trl_step))
                trace.grads.append(_grads(trainer))
        for trainer in trainers:
            sgd_step(trainer, lr)
    for trainer, trace in zip(trainers, traces):
        trace.params = {n: p.detach().clone() for n, p in trainable(trainer.model).items()}
        trace.metrics = {k: list(v) for k, v in trainer._metrics["train"].items()}
    return traces


def generated_steps(traces: Sides) -> int:
    """How many micro-steps trained on completions sampled in the step."""
    return sum(bool(x["generated"]) for x in traces.stock.inputs)


def assert_traces_match(traces: Sides) -> None:
    """Inputs, losses, gradients, parameters; every metric stock stored (GKD stores none) and the patched side's
    `peak_memory_gb`, one per micro-step."""
    assert_inputs_match(traces)
    assert_steps_match(traces)
    stock, patched = traces.stock, traces.patched
    assert set(patched.metrics) == set(stock.metrics) | {"peak_memory_gb"}, (
        sorted(stock.metrics),
        sorted(patched.metrics),
    )
    assert len(patched.metrics["peak_memory_gb"]) == len(stock.losses)
    for key in stock.metrics:
        values = Sides(*(t.metrics[key] for t in traces))
        assert len({len(v) for v in values}) == 1, f"metric {key}: logged a different number of times"
        if key != "step_time":
            check_sides(f"metric {key}", values)
