"""Reward functions as the patched GRPO/RLOO trainers call them: keywords by signature, failures named, results checked.

TRL calls every reward function with `prompts`, `completions`, `completion_ids`, `trainer_state`, `log_extra`,
`log_metric` (and `environments`) and every dataset column as keywords. The patched trainers wrap each callable
reward (reward models are left alone) in a `CheckedReward`:
1. Keywords by signature: a function gets only the keywords its signature accepts (all of them when it takes
   `**kwargs`), so `def reward_fn(completions, prompts)`, as Unsloth's examples write it, works.
2. Checked at trainer set-up, before any rollout: a required parameter that nothing provides (a column the dataset
   lacks) raises, naming the function, the parameter and the dataset's columns.
3. Failures (`slimrl_reward_errors`): "raise" (default) re-raises an exception, naming the function and showing the
   prompt and completion it failed on (found by calling it again on the batch's items one at a time); "skip" scores
   that completion NaN instead (TRL's NaN handling applies: the other functions' rewards still count), and logs the
   count as the metric `rewards/<name>/errors` (TRL's `log_metric`).
4. Results: a wrong number of values, a non-number, NaN or inf is a failure under the same policy (None stays TRL's
   "not applicable" and passes through).
5. A string is a reward model TRL will load (AutoModelForSequenceClassification): checked at set-up to be a local
   model folder or a Hub model id whose config resolves (the cache when offline); otherwise a ValueError says what
   reward_funcs accepts, instead of a Hub connection error from inside TRL.
The wrapper keeps the function's name (TRL names its metrics after it) and its async-ness, and pickles.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from typing import Any

from ... import fields
from ...tasks.custom import TRL_REWARD_KEYWORDS  # what TRL passes to every reward function besides the columns

REWARD_ERROR_POLICIES = fields.BY_NAME[fields.REWARD_ERRORS].choices
_SHOWN_CHARS = 300


class RewardFunctionError(ValueError):
    """A reward function failed or returned something TRL cannot use; the message names it and the input."""


def check_policy(value) -> str:
    if value not in REWARD_ERROR_POLICIES:
        raise ValueError(f"{fields.REWARD_ERRORS} must be one of {REWARD_ERROR_POLICIES}, got {value!r}.")
    return value


def _unwrapped(func):
    while isinstance(func, functools.partial):
        func = func.func
    return func


def _callable_name(func) -> str:
    func = _unwrapped(func)
    return getattr(func, "__name__", type(func).__name__)


def _signature_of(func) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without a signature: pass everything
        return None


def accepted_keywords(func) -> frozenset | None:
    """The keyword names `func` accepts; None when it takes `**kwargs` (or has no readable signature)."""
    signature = _signature_of(func)
    if signature is None or any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return frozenset(
        name for name, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def check_provided(func, columns) -> None:
    """Raise when `func` requires a parameter that neither TRL nor the dataset (`columns`) provides."""
    signature = _signature_of(func)
    if signature is None or columns is None:
        return
    provided = set(TRL_REWARD_KEYWORDS) | set(columns)
    for name, p in signature.parameters.items():
        required = p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if required and name not in provided:
            raise ValueError(
                f"Reward function {_callable_name(func)!r} requires the parameter {name!r}, which nothing provides: "
                f"TRL passes {', '.join(TRL_REWARD_KEYWORDS[:4])} and the dataset's columns "
                f"{sorted(columns)}. Add a {name!r} column to the dataset, or give the parameter a default."
            )


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _bad_value(value) -> str | None:
    """Why `value` is not a usable reward (None: it is; None itself is TRL's "not applicable")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return f"a {type(value).__name__} ({_shown(value)}), not a number"
    number = float(value)
    return None if math.isfinite(number) else f"{number} (rewards must be finite)"


class CheckedReward:
    """A reward function called with the keywords it accepts, its failures named and its results checked."""

    def __init__(self, func, policy: str = "raise"):
        self.func, self.policy = func, check_policy(policy)
        self.__name__ = _callable_name(func)  # TRL names the reward's metrics after it
        self.__doc__ = getattr(func, "__doc__", None)
        # Python names a call's argument errors after these (e.g. a dataset column that repeats a keyword TRL passes
        # itself: "module.func() got multiple values for keyword argument 'completions'", as stock reports it)
        self.__qualname__ = getattr(_unwrapped(func), "__qualname__", self.__name__)
        self.__module__ = getattr(_unwrapped(func), "__module__", None)
        self.accepted = accepted_keywords(func)

    def _keywords(self, kwargs: dict) -> dict:
        return kwargs if self.accepted is None else {k: v for k, v in kwargs.items() if k in self.accepted}

    def _item(self, kwargs: dict, i: int) -> dict:
        """The keywords of one completion (the batch's lists cut to item i; scalars such as trainer_state kept)."""
        n = len(kwargs["prompts"])
        return {k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}

    def _failure(self, kwargs: dict, i: int, why: str) -> RewardFunctionError:
        return RewardFunctionError(
            f"Reward function {self.__name__!r} {why} on completion {i} of the batch.\n"
            f"  prompt:     {_shown(kwargs['prompts'][i])}\n  completion: {_shown(kwargs['completions'][i])}\n"
            "Fix the function, or set slimrl_reward_errors='skip' in the config to score such completions NaN and "
            "count them (metric rewards/<name>/errors)."
        )

    def _results(self, kwargs: dict, output) -> list[tuple[Any, str | None]]:
        """(value, why it is unusable or None) per completion, from the batch call's output."""
        n = len(kwargs["prompts"])
        values = None if output is None else list(output)
        if values is None or len(values) != n:
            why = f"returned {'None' if values is None else len(values)} values for the batch of {n} completions"
            if self.policy == "raise":
                raise RewardFunctionError(
                    f"Reward function {self.__name__!r} {why}: it must return one reward (or None) per completion."
                )
            return [(None, why)] * n
        return [(v, None if (why := _bad_value(v)) is None else f"returned {why}") for v in values]

    def _item_result(self, output) -> tuple[Any, str | None]:
        """(value, why) of one completion's call."""
        values = None if output is None else list(output)
        if values is None or len(values) != 1:
            return None, f"returned {'None' if values is None else len(values)} values for 1 completion"
        why = _bad_value(values[0])
        return (values[0], None) if why is None else (None, f"returned {why}")

    def _apply_policy(self, kwargs: dict, results, error: Exception | None) -> list:
        rewards, failures = [], 0
        for i, (value, why) in enumerate(results):
            if why is not None:
                if self.policy == "raise":
                    raise self._failure(kwargs, i, why) from error
                value, failures = math.nan, failures + 1
            rewards.append(value)
        if failures and callable(kwargs.get("log_metric")):
            kwargs["log_metric"](f"rewards/{self.__name__}/errors", float(failures))
        return rewards

    def _rerun(self, keywords: dict, i: int) -> tuple[Any, str | None]:
        try:
            return self._item_result(self.func(**self._item(keywords, i)))
        except Exception as exc:  # noqa: BLE001 - reported with the item, by policy
            return None, f"raised {type(exc).__name__}: {exc}"

    def __call__(self, **kwargs):
        keywords = self._keywords(kwargs)
        try:
            output = self.func(**keywords)
        except Exception as exc:  # noqa: BLE001 - the failing item is found and reported, by policy
            results = [self._rerun(keywords, i) for i in range(len(kwargs["prompts"]))]
            return self._apply_policy(kwargs, results, exc)
        return self._apply_policy(kwargs, self._results(kwargs, output), None)


class AsyncCheckedReward(CheckedReward):
    """CheckedReward for an async reward function (TRL gathers these concurrently)."""

    async def _rerun_async(self, keywords: dict, i: int) -> tuple[Any, str | None]:
        try:
            return self._item_result(await self.func(**self._item(keywords, i)))
        except Exception as exc:  # noqa: BLE001
            return None, f"raised {type(exc).__name__}: {exc}"

    async def __call__(self, **kwargs):
        keywords = self._keywords(kwargs)
        try:
            output = await self.func(**keywords)
        except Exception as exc:  # noqa: BLE001
            results = [await self._rerun_async(keywords, i) for i in range(len(kwargs["prompts"]))]
            return self._apply_policy(kwargs, results, exc)
        return self._apply_policy(kwargs, self._results(kwargs, output), None)


ACCEPTED_REWARDS = (
    "reward_funcs takes a function `reward(completions, **kwargs) -> list[float]`, a loaded reward model "
    "(AutoModelForSequenceClassification), or a string naming a reward model: a local model folder or a Hub model id"
)


def _function_hint(spec: str) -> str:
    import trl.rewards

    if callable(getattr(trl.rewards, spec, None)):
        return f" {spec!r} is TRL's reward function: pass it, `from trl.rewards import {spec}`."
    return " A function is passed itself (`reward_funcs=[my_reward]`), not by its name."


def check_reward_model_spec(spec: str) -> None:
    """Raise ValueError unless `spec` is a local model folder or a Hub model id whose config.json resolves."""
    if os.path.isdir(spec):
        if os.path.isfile(os.path.join(spec, "config.json")):
            return
        why = "a folder without config.json"
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(spec)
            hf_hub_download(spec, "config.json")
            return
        except Exception as exc:  # noqa: BLE001 - invalid id, offline, missing repo: all said below
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            offline = os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True")
            why = (
                f"not a local folder, and as a Hub model id{' (HF_HUB_OFFLINE is set)' if offline else ''}: {lines[0]}"
            )
    raise ValueError(
        f"reward_funcs entry {spec!r} is neither a function nor a loadable reward model ({why}). "
        f"{ACCEPTED_REWARDS}.{_function_hint(spec)}"
    )


def is_async(func) -> bool:
    func = _unwrapped(func)
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def checked_rewards(reward_funcs, columns, policy: str):
    """`reward_funcs` (one or a list) with every callable wrapped; reward models and model ids left as they are."""
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    wrapped = []
    for func in funcs:
        if isinstance(func, str):
            check_reward_model_spec(func)
        if isinstance(func, (str, CheckedReward)) or hasattr(func, "parameters") or not callable(func):
            wrapped.append(func)
            continue
        check_provided(func, columns)
        wrapped.append((AsyncCheckedReward if is_async(func) else CheckedReward)(func, policy))
    return wrapped if isinstance(reward_funcs, list) else wrapped[0]
