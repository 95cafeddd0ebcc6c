"""Checks run when an RL config or trainer is built, before any heavy work. Errors name the field and a fix.

Config time (after the range of every numeric field, config_ranges.py): a warning for a learning rate outside the
usual range for RL fine-tuning, batch geometry (the generation batch must hold whole groups of
`num_generations` completions: when the user left the generation batch to TRL, slimrl fits it instead of raising,
keeping the micro-batch and accumulation, so per-step memory stays as configured; values the user set that cannot
work raise). Trainer time: the model's `max_seq_length` against the completion length and the dataset's longest
prompt. Rollout time: each prompt batch against `max_seq_length` (for streamed datasets).
"""

from __future__ import annotations

import logging
import math
import os
import warnings

from ...notices import notice
from ...swaps import adjust_default

logger = logging.getLogger("slimrl")

LR_WARN_RANGE = (1e-7, 1e-2)


def check_learning_rate(lr: float) -> None:
    """A warning outside the usual range (the hard range, (0, 1], is config_ranges.py's)."""
    low, high = LR_WARN_RANGE
    if not low <= lr <= high:
        warnings.warn(
            f"learning_rate={lr} is outside [{low:g}, {high:g}], where RL fine-tuning usually works "
            "(LoRA: 1e-5 to 2e-4; full fine-tuning: 1e-7 to 1e-5).",
            UserWarning,
            stacklevel=4,
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def check_batch_geometry(args, world_size: int | None = None) -> None:
    """(per_device_train_batch_size × steps_per_generation × world size) must be a multiple of num_generations.

    steps_per_generation defaults to gradient_accumulation_steps, so by default this is batch × accumulation × world.
    """
    world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    g = args.num_generations
    if g is None:  # (g >= 2 is config_ranges.py's)
        return
    bs, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
    if args.generation_batch_size is not None:
        factor = "generation_batch_size"  # the factor of the product the user can change besides the batch
        total, how = args.generation_batch_size, f"generation_batch_size={args.generation_batch_size}"
    else:
        factor = "steps_per_generation" if args.steps_per_generation else "gradient_accumulation_steps"
        steps = args.steps_per_generation or ga
        total = bs * steps * world
        how = f"per_device_train_batch_size ({bs}) × {factor} ({steps}) × world size ({world}) = {total}"
    if total % g == 0:
        return
    if args.generation_batch_size is None and args.steps_per_generation is None and fit_generation_batch(args, world):
        return
    per_step = max(1, total // bs)  # what multiplies per_device_train_batch_size
    good_bs = [b for b in range(1, 4 * max(bs, g) + 1) if (b * per_step) % g == 0][:4]
    good_g = _divisors(total)
    fitted = ""
    if factor != "generation_batch_size":
        steps = math.lcm(bs * world, g) // (bs * world)
        fitted = f", or steps_per_generation {steps} (generation batch {steps * bs * world}, the rest unchanged)"
    raise ValueError(
        f"the generation batch, {how}, is not divisible by num_generations ({g}): every prompt's {g} completions "
        f"must land in the same generation batch. Values that work: per_device_train_batch_size in {good_bs} "
        f"(keeping the rest), or num_generations in {good_g}, or a {factor} that makes the product a multiple of "
        f"{g}{fitted}."
    )


def fit_generation_batch(args, world: int) -> bool:
    """The least generation batch that holds whole groups of num_generations and splits into micro-batches of
    per_device_train_batch_size x world: set through steps_per_generation (micro-batch and accumulation kept).
    False when steps_per_generation was given (as None: a parser passes every field), so the caller raises."""
    step_rows = args.per_device_train_batch_size * world
    steps = math.lcm(step_rows, args.num_generations) // step_rows
    ga = args.gradient_accumulation_steps
    total = step_rows * ga
    if not adjust_default(args, "steps_per_generation", steps, "whole groups of num_generations per generation batch"):
        return False
    notice(
        f"generation batch {total} (per_device_train_batch_size {args.per_device_train_batch_size} x "
        f"gradient_accumulation_steps {ga} x world size {world}) holds no whole groups of num_generations="
        f"{args.num_generations}: steps_per_generation {ga} -> {steps}, generation batch {total} -> "
        f"{steps * step_rows} ({steps * step_rows // args.num_generations} prompts per generation; micro-batch and "
        "accumulation unchanged). Set steps_per_generation or generation_batch_size yourself to choose."
    )
    return True


def check_config(args) -> None:
    check_learning_rate(args.learning_rate)
    check_batch_geometry(args)


def _prompt_lengths(dataset, tokenizer, limit: int) -> list[int]:
    from trl.data_utils import apply_chat_template, is_conversational

    rows = dataset.select(range(min(len(dataset), limit))) if limit else dataset
    texts = []
    for example in rows:
        if is_conversational({"prompt": example["prompt"]}):
            texts.append(apply_chat_template({"prompt": example["prompt"]}, tokenizer)["prompt"])
        else:
            texts.append(example["prompt"])
    tok = getattr(tokenizer, "tokenizer", tokenizer)  # processors wrap their tokenizer
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in enc]


def check_max_seq_length(
    model,
    args,
    train_dataset=None,
    processing_class=None,
    scan_limit: int = 100_000,
    completion_field: str = "max_completion_length",
) -> None:
    """The model's max_seq_length (set by FastLanguageModel) must hold the longest prompt plus the completion
    (`completion_field`: the config's name of the completion length, OnlineDPO's is `max_new_tokens`)."""
    max_len = getattr(model, "max_seq_length", None)
    completion = getattr(args, completion_field, None)
    if not max_len or not completion:
        return
    if completion >= max_len:
        raise ValueError(
            f"{completion_field} ({completion}) leaves no room for a prompt within the model's max_seq_length "
            f"({max_len}). Lower {completion_field} or load the model with a larger max_seq_length."
        )
    if train_dataset is None or processing_class is None or not hasattr(train_dataset, "select"):
        return
    if "prompt" not in getattr(train_dataset, "column_names", []):
        return
    lengths = _prompt_lengths(train_dataset, processing_class, scan_limit)
    if not lengths:
        return
    limit = getattr(args, "max_prompt_length", None)  # prompts are cut to it before generation (prompt_limit.py)
    if limit is not None:
        lengths = [min(n, limit) for n in lengths]
    longest = max(lengths)
    if longest + completion > max_len:
        too_long = sum(1 for n in lengths if n + completion > max_len)
        cut_hint = "set max_prompt_length to cut them, " if hasattr(args, "max_prompt_length") else ""
        raise ValueError(
            f"{too_long} prompt(s) in train_dataset (the longest {longest} tokens) plus {completion_field} "
            f"({completion}) exceed the model's max_seq_length ({max_len}). Raise max_seq_length in "
            f"FastLanguageModel.from_pretrained, lower {completion_field}, {cut_hint}filter the long prompts."
        )


def check_rollout_lengths(model, prompt_ids, max_completion_length) -> None:
    max_len = getattr(model, "max_seq_length", None)
    if not max_len or not prompt_ids or not max_completion_length:
        return
    longest = max(len(p) for p in prompt_ids)
    if longest + max_completion_length > max_len:
        raise ValueError(
            f"A prompt of {longest} tokens plus max_completion_length ({max_completion_length}) exceeds the model's "
            f"max_seq_length ({max_len}). Raise max_seq_length, lower max_completion_length, or shorten the prompts."
        )
