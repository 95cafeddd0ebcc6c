"""Shared harness for the stock-vs-patched parity tests of TRL's online RL trainers (GRPO, RLOO).

Choices, and why:
- Two trainers live side by side: the stock one is built while TRL is unpatched, the patched one after
  `PatchFastRL(algorithm)`. Patches are class-level, so every stock call (`training_step`, generation) runs inside
  `stock_state()` (unpatched) and every patched call inside `patched_state()`; `unpatch()` always runs on exit.
  The stock trainer's model keeps TRL's fused head on its instance either way.
- Same weights: each side gets its own model from the same factory and seed (LoRA adapters created by TRL from
  `peft_config` are seeded too). The EOS row of the LM head is scaled up so random models stop at varied lengths:
  completions get right padding, truncated and finished rows mix (mask_truncated_completions has work to do).
- Same rollouts: each micro-step reseeds torch before `training_step`, so both sides sample the same completions
  and shuffle the buffer the same way; the harness checks this (prompt/completion ids must be equal) and compares
  what each side computed with no grad through its own head (old / reference log-probs, advantages).
- One optimizer step = `gradient_accumulation_steps` calls of the trainer's own `training_step` (TRL's
  `_prepare_inputs` buffering, `num_iterations`, `steps_per_generation`, loss normalisation all run), then a plain
  SGD step taken identically on both sides. SGD (not Adam) keeps tiny float differences tiny after the step.
- Tolerances are relative to the tensor's norm (the patched head sums in a different order than TRL's tiles).
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from slimrl.patches import registry  # noqa: E402
from slimrl.testing import tiny_llama, tiny_tokenizer  # noqa: E402

VOCAB, HIDDEN, LAYERS = 512, 32, 2
EOS_ID = 2
EOS_BOOST = 40.0  # scales the EOS row of lm_head: P(EOS) then swings between ~0 and ~1 across contexts
RTOL = 1e-5
# The harness's own SGD step: large enough that the second step is clearly off-policy (ratios clip). Full
# fine-tuning moves every weight, so it gets a smaller step: at 0.1 VESPO's gamma weights collapse to ~0 on the
# second step and its loss becomes a cancellation of tiny terms (relative error 9e-6 from conditioning alone).
SGD_LR, FULL_FT_SGD_LR = 0.1, 0.03
# Prompts of different lengths, so every batch mixes left-padding amounts
PROMPTS = [
    "what is 3 plus 4 ?",
    "please compute the sum of 12 and 7 and write the final answer",
    "hello world",
    "solve 8 times 9 step by step",
    "how many numbers are in this question ?",
    "the answer is",
]


def trl_classes(algorithm: str):
    import trl

    return {"grpo": (trl.GRPOConfig, trl.GRPOTrainer), "rloo": (trl.RLOOConfig, trl.RLOOTrainer)}[algorithm]


def reward_ids(completions, completion_ids, **kwargs):
    """Deterministic reward with spread inside every group: token-id checksum plus a length term."""
    return [float(sum(ids) % 7) + 0.5 * len(ids) for ids in completion_ids]


def tiny_model(seed: int = 0):
    model = tiny_llama(seed=seed, vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS)
    with torch.no_grad():
        model.lm_head.weight[EOS_ID] *= EOS_BOOST
    return model


def save_tiny(path: str, seed: int = 0) -> str:
    """A tiny model on disk: TRL rebuilds a full fine-tuning reference from `config._name_or_path`."""
    tiny_model(seed).save_pretrained(path)
    tiny_tokenizer(VOCAB).save_pretrained(path)
    return path


def load_tiny(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, EOS_ID
    return model


def lora_config(**overrides):
    from peft import LoraConfig

    # init_lora_weights=False: B is random too, so the adapter already moves the outputs (and every LoRA matrix
    # gets a gradient on the first step), and an adapter-disabled reference differs from the policy from step 1
    kw = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "gate_proj"],
              init_lora_weights=False, task_type="CAUSAL_LM")
    kw.update(overrides)
    return LoraConfig(**kw)


def dataset(n: int = 6):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n)]})


def make_config(algorithm: str, output_dir: str, **overrides):
    """A small CPU fp32 config; `overrides` win. Built in the current patch state (slimrl fields need the patch)."""
    config_cls, _ = trl_classes(algorithm)
    kw = dict(output_dir=output_dir, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
              per_device_train_batch_size=4, num_generations=2, max_completion_length=7, learning_rate=1e-2,
              gradient_checkpointing=False, seed=0, disable_dropout=True, dataloader_pin_memory=False)
    kw.update(overrides)
    return config_cls(**kw)


@contextmanager
def stock_state():
    registry.unpatch()
    yield


@contextmanager
def patched_state(algorithm: str):
    registry.PatchFastRL(algorithm)
    try:
        yield
    finally:
        registry.unpatch()


def build_trainer(algorithm: str, model, args, peft_config=None, seed: int = 0, train_dataset=None):
    _, trainer_cls = trl_classes(algorithm)
    torch.manual_seed(seed)  # TRL creates LoRA adapters from peft_config with the global RNG
    trainer = trainer_cls(model=model, reward_funcs=reward_ids, args=args, train_dataset=train_dataset or dataset(),
                          processing_class=tiny_tokenizer(VOCAB), peft_config=peft_config)
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by Trainer.train otherwise
    return trainer


def head_file(trainer) -> str:
    """Source file of the log-prob head installed on the trainer's policy (TRL's utils.py or slimrl's logprob.py)."""
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.forward.__func__.__code__.co_filename


def generation_batch(args) -> list[dict]:
    """One generation batch as TRL's RepeatSampler lays it out: each prompt `num_generations` times in a row."""
    size = args.per_device_train_batch_size * args.steps_per_generation
    n_prompts = size // args.num_generations
    return [{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(n_prompts) for _ in range(args.num_generations)]


@dataclass
class Trace:
    """What one side produced over the run, in order of micro-steps."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)  # accumulated .grad after each micro-step
    inputs: list[dict[str, torch.Tensor]] = field(default_factory=list)  # the micro-batch each step trained on
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # trainable parameters at the end


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def micro_step(trainer, gen_batch, seed: int, trace: Trace) -> None:
    torch.manual_seed(seed)
    step = trainer._step
    loss = trainer.training_step(trainer.model, gen_batch, None)
    trace.losses.append(float(loss))
    buffered = trainer._buffered_inputs[step % trainer.args.steps_per_generation]
    trace.inputs.append({k: v.detach().clone() for k, v in buffered.items() if isinstance(v, torch.Tensor)})
    trace.grads.append({n: p.grad.detach().clone() for n, p in trainable(trainer.model).items()
                        if p.grad is not None})


def sgd_step(trainer, lr: float) -> None:
    with torch.no_grad():
        for p in trainable(trainer.model).values():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
            p.grad = None


def run_pair(algorithm: str, stock, patched, optimizer_steps: int = 2, lr: float | None = None,
             seed: int = 1234) -> tuple[Trace, Trace]:
    """Run `optimizer_steps` steps on two trainers; stock calls unpatched, patched calls patched."""
    if lr is None:
        lr = SGD_LR if hasattr(stock.model, "peft_config") else FULL_FT_SGD_LR
    ga = stock.args.gradient_accumulation_steps
    gen_batch = generation_batch(stock.args)
    traces = Trace(), Trace()
    for step in range(optimizer_steps):
        for micro in range(ga):
            micro_seed = seed + 100 * step + micro
            with stock_state():
                micro_step(stock, gen_batch, micro_seed, traces[0])
            with patched_state(algorithm):
                micro_step(patched, gen_batch, micro_seed, traces[1])
        for trainer in (stock, patched):
            sgd_step(trainer, lr)
    for trainer, trace in zip((stock, patched), traces):
        trace.params = {n: p.detach().clone() for n, p in trainable(trainer.model).items()}
    return traces


def build_pair(algorithm: str, model_factory, config_kwargs: dict, output_dir: str, peft_config=None,
               num_chunks: int | None = None, patched_config: dict | None = None):
    """(stock, patched) trainers on identical models; `num_chunks` goes to the patched config's slimrl_num_chunks,
    `patched_config` (slimrl-only fields) to the patched config alone."""
    with stock_state():
        stock = build_trainer(algorithm, model_factory(), make_config(algorithm, output_dir, **config_kwargs),
                              copy.deepcopy(peft_config))
    with patched_state(algorithm):
        extra = {} if num_chunks is None else {"slimrl_num_chunks": num_chunks}
        extra.update(patched_config or {})
        patched = build_trainer(algorithm, model_factory(),
                                make_config(algorithm, output_dir, **config_kwargs, **extra),
                                copy.deepcopy(peft_config))
    return stock, patched


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).norm() / expected.norm().clamp(min=1e-30))


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = RTOL,
                     atol: float = 1e-8) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = float((actual.double() - expected.double()).norm())
    bound = rtol * float(expected.double().norm()) + atol
    assert diff <= bound, f"{what}: |patched - stock| = {diff:.3e} > {bound:.3e} (rel {rel_err(actual, expected):.2e})"


# Inputs that must be bit-identical (sampling, padding, token counts); every other float input (old / reference
# log-probs computed with no grad through each side's head, advantages) is compared with the tolerance
EXACT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "num_items_in_batch")


def assert_steps_match(stock, patched, rtol: float = RTOL) -> None:
    """Per micro-step losses and gradients, and the final weights: the comparison every parity harness shares."""
    for i, (ls, lp) in enumerate(zip(stock.losses, patched.losses)):
        assert abs(lp - ls) <= rtol * abs(ls) + 1e-7, f"micro-step {i}: loss patched {lp!r} != stock {ls!r}"
    for i, (gs, gp) in enumerate(zip(stock.grads, patched.grads)):
        assert gs.keys() == gp.keys(), f"micro-step {i}: parameters with a gradient differ"
        assert gs, f"micro-step {i}: no parameter received a gradient"
        for name in gs:
            assert_close_rel(gp[name], gs[name], f"micro-step {i}: grad of {name}", rtol)
    for name in stock.params:
        assert_close_rel(patched.params[name], stock.params[name], f"final {name}", rtol)


def assert_traces_match(stock: Trace, patched: Trace, rtol: float = RTOL) -> None:
    assert len(stock.losses) == len(patched.losses)
    for i, (s_in, p_in) in enumerate(zip(stock.inputs, patched.inputs)):
        assert s_in.keys() == p_in.keys(), f"micro-step {i}: input keys {sorted(s_in)} != {sorted(p_in)}"
        for key in EXACT_KEYS:
            if key in s_in:
                assert torch.equal(s_in[key], p_in[key]), f"micro-step {i}: {key} differs (rollouts diverged)"
        for key in s_in.keys() - set(EXACT_KEYS):
            if s_in[key].is_floating_point():
                assert_close_rel(p_in[key], s_in[key], f"micro-step {i}: {key}", rtol)
    assert_steps_match(stock, patched, rtol)


def train_side(algorithm: str, model_factory, config_kwargs: dict, output_dir: str, peft_config=None,
               patched: bool = False, num_chunks: int | None = None, seed: int = 0):
    """Build and `train()` one trainer, stock (unpatched) or patched; returns the trainer."""
    state = patched_state(algorithm) if patched else stock_state()
    with state:
        extra = {} if (num_chunks is None or not patched) else {"slimrl_num_chunks": num_chunks}
        args = make_config(algorithm, output_dir, **config_kwargs, **extra)
        trainer = build_trainer(algorithm, model_factory(), args, copy.deepcopy(peft_config), seed=seed)
        trainer.train()
    return trainer


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]
