"""Training tasks for `slimrl grpo`: built-in generated tasks and user datasets with user reward functions.

A `Task` bundles what the CLI needs: train and held-out eval `datasets.Dataset`s (a conversational or plain "prompt"
column plus reward columns), the reward functions (TRL signature), the one used as eval accuracy, and how to wrap
free text for `slimrl generate`. Built-ins are registered in `BUILTIN_TASKS`; everything is importable without TRL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .rewards import completion_text, correctness_reward, format_reward, parse_answer


@dataclass
class Task:
    name: str
    train_dataset: object
    eval_dataset: object | None
    reward_funcs: list[Callable]
    accuracy_reward: Callable | None = None
    format_user_prompt: Callable[[str], object] | None = None
    info: dict = field(default_factory=dict)


def arithmetic_task(num_train_samples: int = 1000, num_eval_samples: int = 64, seed: int = 42, **options) -> Task:
    """options: max_operand, operations ("+", "-" or "+-"), num_examples (worked example turns per prompt)."""
    import functools

    from . import arithmetic

    options = {**arithmetic.DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    unknown = set(options) - set(arithmetic.DEFAULTS)
    if unknown:
        raise ValueError(f"unknown arithmetic option(s) {sorted(unknown)}; known: {sorted(arithmetic.DEFAULTS)}")
    train, evaluation = arithmetic.arithmetic_splits(num_train_samples, num_eval_samples, seed, **options)
    return Task(
        "arithmetic",
        train,
        evaluation,
        list(arithmetic.REWARD_FUNCS),
        arithmetic.ACCURACY_REWARD,
        functools.partial(arithmetic.format_user_prompt, **options),
        dict(options),
    )


BUILTIN_TASKS = {"arithmetic": arithmetic_task}


def get_builtin_task(name: str, **kwargs) -> Task:
    if name not in BUILTIN_TASKS:
        raise ValueError(
            f"Unknown task {name!r}; built-in tasks: {sorted(BUILTIN_TASKS)} "
            "(or pass --dataset_name with --reward_funcs)"
        )
    return BUILTIN_TASKS[name](**kwargs)


__all__ = [
    "Task",
    "BUILTIN_TASKS",
    "get_builtin_task",
    "arithmetic_task",
    "format_reward",
    "correctness_reward",
    "parse_answer",
    "completion_text",
]
