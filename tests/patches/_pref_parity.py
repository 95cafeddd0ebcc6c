"""Shared harness for the stock-vs-patched parity tests of TRL's offline trainers (DPO, KTO, SFT, reward).

Choices, and why:
- Four trainers on identical models (same factory and seed; LoRA adapters created by TRL from `peft_config` after
  TRL's own `set_seed(args.seed)`): the sides of _parity (stock, patched, float64 reference, perturbed reference),
  each built and run in its own state (`_parity.side_state`).
- Same data: each side draws its micro-batches from its own `get_train_dataloader()` after the same
  `torch.manual_seed`, and counts `num_items_in_batch` with Trainer's `get_batch_samples`, as `Trainer.train` does;
  the harness checks the batches are identical (ids, masks, labels) and compares float columns (precomputed
  reference log-probs, computed by each side through its own head) by the tolerance rule.
- One optimizer step = `gradient_accumulation_steps` calls of the trainer's own `training_step` (TRL's
  `compute_loss`, activation-offload context, GA scaling all run), then the same plain SGD step on both sides.
- Compared: loss of every micro-step, accumulated gradients, final parameters, and every metric TRL stored for
  logging (`_metrics["train"]`); the patched side must log the same keys plus `peak_memory_gb`.
- Each side gets its own `Dataset` object (fresh random fingerprint), so TRL's precompute cache file (keyed by the
  dataset fingerprint and the model hash) is never shared between the two sides.
"""

from __future__ import annotations

import torch

from slimrl.testing import tiny_llama_config

import _harness as HS
import _tiny as T
from _models_helpers import trainer_enables_checkpointing
from _parity import Sides, Trace, side_model

SLIMRL_HEAD, STOCK_HEAD = "slimrl/ops/logprob.py", "trl/trainer/utils.py"
# The harness's SGD step (TRL's optimizer is not used). Full fine-tuning moves every weight, so it gets a smaller
# step: full-FT IPO (beta 0.1, loss 25 at step 1) overshoots at 0.03-0.05 (loss 25 -> 55) and its second-step
# gradients then amplify the 2e-7 first-step difference to 1-4e-5 (conditioning, not the head; 1.7e-6 at 0.01).
SGD_LR, FULL_FT_SGD_LR = 0.05, 0.01

PROMPTS = [*T.PROMPTS, "write the product of 6 and 7"]  # GRPO's prompts, one more for odd batch sizes
GOOD = ["7", "the answer is 19 .", "hello", "8 times 9 is 72 and that is the final result", "eight", "yes", "42 ."]
BAD = ["8 or 9 or maybe 10", "no", "good bye world and thanks", "71", "i think it is many numbers", "no no", "6"]


def trl_classes(algorithm: str):
    import trl

    return {
        "dpo": (trl.DPOConfig, trl.DPOTrainer),
        "kto": (trl.KTOConfig, trl.KTOTrainer),
        "sft": (trl.SFTConfig, trl.SFTTrainer),
        "reward": (trl.RewardConfig, trl.RewardTrainer),
    }[algorithm]


def dataset(kind: str, n: int = 9):
    """Rows with prompts and completions of different lengths (`kind`: preference, kto, text, prompt_completion,
    reward)."""
    from datasets import Dataset

    rows = range(n)
    p = [PROMPTS[i % len(PROMPTS)] for i in rows]
    # completions start with a space: the word-level tokenizer would merge "world" + "hello" across the boundary
    g = [" " + GOOD[i % len(GOOD)] for i in rows]
    b = [" " + BAD[i % len(BAD)] for i in rows]
    if kind == "preference":
        return Dataset.from_dict({"prompt": p, "chosen": g, "rejected": b})
    if kind == "kto":
        # unpaired, both labels present, not alternating
        labels = [i % 3 != 1 for i in rows]
        return Dataset.from_dict(
            {"prompt": p, "completion": [gi if lab else bi for gi, bi, lab in zip(g, b, labels)], "label": labels}
        )
    if kind == "text":
        return Dataset.from_dict({"text": [f"{pi}{gi}" for pi, gi in zip(p, g)]})
    if kind == "prompt_completion":
        return Dataset.from_dict({"prompt": p, "completion": g})
    if kind == "reward":
        return Dataset.from_dict(
            {"chosen": [f"{pi}{gi}" for pi, gi in zip(p, g)], "rejected": [f"{pi}{bi}" for pi, bi in zip(p, b)]}
        )
    raise ValueError(kind)


DATA_KIND = {"dpo": "preference", "kto": "kto", "sft": "text", "reward": "reward"}


def tiny_reward_model(seed: int = 0):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = tiny_llama_config(vocab_size=T.VOCAB, hidden_size=T.HIDDEN, num_layers=T.LAYERS, num_labels=1)
    return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)


def make_config(algorithm: str, output_dir: str, **overrides):
    return HS.parity_config(trl_classes(algorithm)[0], output_dir, {"max_length": 48}, overrides)


def build_trainer(algorithm: str, model, args, peft_config=None, train_dataset=None, seed: int = 0):
    _, trainer_cls = trl_classes(algorithm)
    train_dataset = train_dataset or dataset(DATA_KIND[algorithm])
    return HS.build_offline_trainer(trainer_cls, model, args, peft_config, train_dataset, seed)


def build_sides(
    algorithm: str,
    model_factory,
    config_kwargs: dict,
    output_dir: str,
    peft_config=None,
    num_chunks: int | None = None,
    data_kind: str | None = None,
    patched_model_setup=None,
    patched_config: dict | None = None,
    data=None,
) -> Sides:
    """The sides' trainers (_parity) on identical models; `num_chunks` / `patched_config` go to the
    patched config only, `patched_model_setup(model)` prepares the patched side's model only (e.g. FastLanguageModel's
    checkpointing); `data()`, when given, builds each side's own dataset instead of `dataset(data_kind)`."""
    kind = data_kind or DATA_KIND[algorithm]

    def build_side(side: str):
        model = side_model(side, model_factory)
        if side == "patched" and patched_model_setup is not None:
            model = patched_model_setup(model)
        args = make_config(algorithm, output_dir, **HS.side_config(side, config_kwargs, num_chunks, patched_config))
        train_dataset = dataset(kind) if data is None else data()
        return build_trainer(algorithm, model, args, peft_config, train_dataset)

    return HS.build_each_side(algorithm, build_side)


def enable_checkpointing_like_train(trainer) -> None:
    """What `Trainer.train` does before its loop when the config asks for checkpointing (its field and method names
    are transformers 5.23's, or the older ones before 5.23)."""
    args = trainer.args
    if not getattr(args, "activation_checkpointing", args.gradient_checkpointing):
        return
    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None) or args.gradient_checkpointing_kwargs or {})
    every_n_layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    trainer_enables_checkpointing(trainer.model, kwargs or None, every_n_layers, offload)


def run_side(trainer, optimizer_steps: int = 2, lr: float | None = None, seed: int = 1234) -> Trace:
    """`optimizer_steps` steps of GA micro-steps through the trainer's own training_step, SGD in between."""
    lr = HS.sgd_lr(trainer.model, SGD_LR, FULL_FT_SGD_LR) if lr is None else lr
    enable_checkpointing_like_train(trainer)
    return HS.run_dataloader_side(trainer, lr, "_metrics", optimizer_steps, seed)


def run_sides(algorithm: str, trainers: Sides, **kwargs) -> Sides:
    """Each side's whole run in its own state (the batches come from each side's own dataloader)."""
    return HS.run_each_side(algorithm, trainers, run_side, **kwargs)


def assert_traces_match(traces: Sides) -> None:
    HS.assert_traces_match(traces)
    assert len(traces.patched.metrics["peak_memory_gb"]) == len(traces.stock.losses)


def head_file(trainer) -> str:
    """Source file of the log-prob head installed on the trainer's policy (TRL's utils.py or slimrl's logprob.py)."""
    return T.head_file(trainer)
