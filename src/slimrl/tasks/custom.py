"""User tasks: any Hugging Face dataset or local JSON/JSONL/CSV/Parquet file, with reward functions given by name.

Choices made:
- Everything that can be checked before loading a model is checked here and raises `TaskError` (a ValueError) with the
  fix in the message: file not found, missing prompt column, unimportable or non-callable reward function, a reward
  function that names a dataset column the dataset lacks.
- A reward is a dotted path (`my_pkg.rewards.my_reward`, the current directory is importable as in `trl grpo`), a
  file path (`path/to/rewards.py:my_reward`), or a built-in name: slimrl's `format_reward` / `correctness_reward`, or
  TRL's `accuracy_reward` / `think_format_reward` / `reasoning_accuracy_reward`.
- The prompt column is renamed to "prompt" (what GRPOTrainer reads). Without a test split, the held-out split is cut
  from train with `train_test_split(seed=seed)`; `num_train_samples`/`num_eval_samples` cap the splits (None = all).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable

LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Arguments TRL itself passes to every reward function (grpo_trainer._calculate_rewards), never dataset columns
TRL_REWARD_KEYWORDS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)


class TaskError(ValueError):
    """A task/dataset/reward problem found before any heavy work; the message says what to change."""


def _builtin_reward(name: str) -> Callable | None:
    from . import rewards

    if name in ("format_reward", "correctness_reward", "closeness_reward"):
        return getattr(rewards, name)
    if name in ("accuracy_reward", "think_format_reward", "reasoning_accuracy_reward"):
        import trl.rewards

        return getattr(trl.rewards, name)
    return None


def load_reward_func(spec: str) -> Callable:
    """Resolve `module.func`, `path/file.py:func` or a built-in reward name to a callable."""
    builtin = _builtin_reward(spec)
    if builtin is not None:
        return builtin
    if ":" in spec:
        path, func_name = spec.rsplit(":", 1)
        if not os.path.isfile(path):
            raise TaskError(f"Reward file {path!r} (from {spec!r}) not found")
        module_name = "slimrl_user_rewards_" + os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: report any failure with its cause
            raise TaskError(f"Could not import reward file {path!r}: {type(exc).__name__}: {exc}") from exc
    elif "." in spec:
        module_path, func_name = spec.rsplit(".", 1)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            raise TaskError(
                f"Could not import module {module_path!r} for reward {spec!r}: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        raise TaskError(
            f"Reward {spec!r} is neither a built-in (format_reward, correctness_reward, closeness_reward, "
            "accuracy_reward, "
            "think_format_reward, reasoning_accuracy_reward), a dotted path (pkg.module.func) nor "
            "path/to/file.py:func"
        )
    func = getattr(module, func_name, None)
    if func is None:
        raise TaskError(f"{module.__name__!r} has no attribute {func_name!r} (reward {spec!r})")
    if not callable(func):
        raise TaskError(f"Reward {spec!r} is not callable")
    return func


def check_reward_columns(func: Callable, columns: list[str]) -> None:
    """Raise when `func` requires a keyword argument that is neither a TRL argument nor a dataset column."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return
    for p in params:
        needed = p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if needed and p.name not in (*TRL_REWARD_KEYWORDS, "kwargs") and p.name not in columns:
            raise TaskError(
                f"Reward function {getattr(func, '__name__', func)!r} needs argument {p.name!r}, which "
                f"is not a dataset column (columns: {columns})"
            )


def load_splits(dataset_name: str, dataset_config: str | None):
    from datasets import load_dataset

    ext = os.path.splitext(dataset_name)[1].lower()
    if ext in LOCAL_BUILDERS:
        if not os.path.isfile(dataset_name):
            raise TaskError(f"Dataset file {dataset_name!r} not found")
        return load_dataset(LOCAL_BUILDERS[ext], data_files=dataset_name)
    looks_local = dataset_name.startswith((".", "/", "~")) or os.sep in dataset_name.strip("/").split("/", 1)[-1]
    if looks_local and not os.path.exists(dataset_name):
        raise TaskError(f"Dataset path {dataset_name!r} not found")
    try:
        return load_dataset(dataset_name, name=dataset_config)
    except FileNotFoundError as exc:
        raise TaskError(f"Dataset {dataset_name!r} not found locally or on the Hub: {exc}") from exc


def dataset_task(
    dataset_name: str,
    reward_funcs: list[str],
    dataset_config: str | None = None,
    prompt_column: str = "prompt",
    dataset_train_split: str = "train",
    dataset_test_split: str = "test",
    num_train_samples: int | None = None,
    num_eval_samples: int | None = None,
    seed: int = 42,
    accuracy_reward: str | None = None,
    require_rewards: bool = True,
):
    """A `Task` from a dataset and reward specs; every cheap check runs before the dataset is loaded.
    `require_rewards=False`: no reward function is needed (a judge ranks the completions instead)."""
    from . import Task

    if not reward_funcs and require_rewards:
        raise TaskError("A dataset task needs at least one --reward_funcs (dotted path, file.py:func or built-in name)")
    funcs = [load_reward_func(spec) for spec in reward_funcs]
    accuracy = load_reward_func(accuracy_reward) if accuracy_reward else None
    splits = load_splits(dataset_name, dataset_config)
    if dataset_train_split not in splits:
        raise TaskError(f"Dataset {dataset_name!r} has no split {dataset_train_split!r} (splits: {list(splits)})")
    train = splits[dataset_train_split]
    if prompt_column not in train.column_names:
        raise TaskError(
            f"Dataset {dataset_name!r} has no column {prompt_column!r} (columns: {train.column_names}); "
            "pass --prompt_column"
        )
    if prompt_column != "prompt":
        if "prompt" in train.column_names:
            train = train.remove_columns("prompt")
        train = train.rename_column(prompt_column, "prompt")
    for func in funcs + ([accuracy] if accuracy else []):
        check_reward_columns(func, train.column_names)
    evaluation = None
    if dataset_test_split in splits:
        evaluation = splits[dataset_test_split]
        if prompt_column != "prompt":
            evaluation = evaluation.rename_column(prompt_column, "prompt")
    elif num_eval_samples and len(train) > num_eval_samples:
        parts = train.train_test_split(test_size=num_eval_samples, seed=seed)
        train, evaluation = parts["train"], parts["test"]
    if num_train_samples is not None:
        train = train.select(range(min(num_train_samples, len(train))))
    if evaluation is not None and num_eval_samples is not None:
        evaluation = evaluation.select(range(min(num_eval_samples, len(evaluation))))
    return Task(
        os.path.basename(dataset_name.rstrip("/")) or dataset_name,
        train,
        evaluation,
        funcs,
        accuracy,
        None,
        {"dataset_name": dataset_name, "reward_funcs": list(reward_funcs)},
    )
