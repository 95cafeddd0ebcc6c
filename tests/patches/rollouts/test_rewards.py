"""slimrl.patches.rollouts.rewards: reward functions called with the keywords they accept, failures named with their
input,
the "raise" and "skip" policies, results checked (wrong count, non-numbers, NaN/inf; None passes)."""

import asyncio
import functools
import math
import pickle
import re

import pytest

from slimrl.patches.rollouts.rewards import AsyncCheckedReward, CheckedReward, RewardFunctionError, checked_rewards

PROMPTS = ["what is 1 + 1 ?", "what is 2 + 5 ?", "say hi"]
COMPLETIONS = ["<answer>2</answer>", "<answer>8</answer>", "hi"]


def _call(reward, **extra):
    """As TRL calls it: every keyword, the dataset columns, the trainer's helpers."""
    logged = []
    kwargs = dict(
        prompts=PROMPTS,
        completions=COMPLETIONS,
        completion_ids=[[1], [2], [3]],
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=lambda name, value: logged.append((name, value)),
        answer=["2", "7", ""],
        **extra,
    )
    return reward(**kwargs), logged


def length_reward(completions, prompts):  # Unsloth's examples: only the keywords it needs, in any order
    return [float(len(c) - len(p) % 3) for c, p in zip(completions, prompts)]


def test_unsloth_signature_gets_only_its_keywords():
    rewards, _ = _call(CheckedReward(length_reward))
    assert rewards == length_reward(COMPLETIONS, PROMPTS)


def test_kwargs_signature_gets_everything():
    seen = {}

    def everything(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["prompts"])

    _call(CheckedReward(everything))
    assert {"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "answer"} <= set(seen)


def test_name_async_and_pickling_are_kept():
    wrapped = checked_rewards([length_reward, functools.partial(length_reward)], ["prompt", "answer"], "raise")
    assert [w.__name__ for w in wrapped] == ["length_reward", "length_reward"]
    assert pickle.loads(pickle.dumps(wrapped[0]))(prompts=["a"], completions=["ab"]) == length_reward(["ab"], ["a"])

    async def async_reward(completions, **kwargs):
        return [1.0 for _ in completions]

    wrapped_async = checked_rewards([async_reward], ["prompt"], "raise")[0]
    assert isinstance(wrapped_async, AsyncCheckedReward) and asyncio.iscoroutinefunction(type(wrapped_async).__call__)
    assert asyncio.run(_call(wrapped_async)[0]) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("reward", [length_reward, functools.partial(length_reward)])
def test_a_repeated_keyword_is_named_after_the_function(reward):
    """A dataset column named like a keyword TRL passes itself ('completions'): the error names the user's function,
    as stock's does (for a partial, stock prints the partial's repr and an address)."""
    with pytest.raises(TypeError) as raised:
        CheckedReward(reward)(prompts=PROMPTS, completions=COMPLETIONS, **{"completions": COMPLETIONS})
    expected = "test_rewards.length_reward() got multiple values for keyword argument 'completions'"
    assert str(raised.value) == expected
    with pytest.raises(TypeError, match=re.escape(expected)):
        length_reward(prompts=PROMPTS, completions=COMPLETIONS, **{"completions": COMPLETIONS})


def test_reward_models_and_names_are_left_alone(tmp_path):
    from slimrl.testing import save_tiny_model

    model_id = save_tiny_model(tmp_path / "reward-model")  # a string TRL loads as a model: a local model folder
    module = type("RM", (), {"parameters": lambda self: iter(())})()
    assert checked_rewards([model_id, module], ["prompt"], "raise") == [model_id, module]


def test_missing_column_fails_at_setup_naming_function_parameter_and_columns():
    def needs_solution(completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'needs_solution' requires the parameter 'solution'.*\['answer', 'prompt'\]"):
        checked_rewards([needs_solution], ["prompt", "answer"], "raise")
    checked_rewards([needs_solution], ["prompt", "solution"], "raise")  # provided: fine


def test_raising_reward_names_the_function_and_the_failing_input():
    def fragile(completions, **kwargs):
        return [1.0 / (len(c) - 2) for c in completions]  # "hi": division by zero

    with pytest.raises(RewardFunctionError) as err:
        _call(CheckedReward(fragile))
    msg = str(err.value)
    assert "'fragile' raised ZeroDivisionError" in msg and "completion 2" in msg
    assert "'say hi'" in msg and "'hi'" in msg and "slimrl_reward_errors='skip'" in msg


@pytest.mark.parametrize(
    "returned, why",
    [
        (lambda n: [1.0] * (n - 1), "returned 2 values for the batch of 3"),
        (lambda n: [1.0, "good", 0.0], r"returned a str \('good'\), not a number"),
        (lambda n: [1.0, math.nan, 0.0], "returned nan"),
        (lambda n: [1.0, math.inf, 0.0], "returned inf"),
    ],
)
def test_unusable_results_are_named(returned, why):
    def bad(completions, **kwargs):
        return returned(len(completions))

    with pytest.raises(RewardFunctionError, match=why):
        _call(CheckedReward(bad))


def test_none_stays_not_applicable():
    rewards, logged = _call(CheckedReward(lambda completions, **kw: [None, 1.0, 0.5]))
    assert rewards == [None, 1.0, 0.5] and logged == []


def test_skip_scores_failing_completions_nan_and_counts_them():
    def fragile(completions, **kwargs):
        return [1.0 / (len(c) - 2) for c in completions]

    rewards, logged = _call(CheckedReward(fragile, "skip"))
    assert rewards[:2] == [1.0 / 16, 1.0 / 16] and math.isnan(rewards[2])
    assert logged == [("rewards/fragile/errors", 1.0)]
    bad_values, logged = _call(CheckedReward(lambda completions, **kw: [1.0, math.inf, "x"], "skip"))
    assert bad_values[0] == 1.0 and math.isnan(bad_values[1]) and math.isnan(bad_values[2])
    assert logged == [("rewards/<lambda>/errors", 2.0)]


def test_negative_control_a_good_reward_is_untouched():
    calls = []

    def good(completions, answer):
        calls.append(1)
        return [float(c == f"<answer>{a}</answer>") for c, a in zip(completions, answer)]

    rewards, logged = _call(CheckedReward(good, "skip"))
    assert rewards == [1.0, 0.0, 0.0] and logged == [] and len(calls) == 1, "one batch call, no per-item re-run"


def test_policy_is_validated():
    with pytest.raises(ValueError, match="slimrl_reward_errors must be one of"):
        CheckedReward(length_reward, "ignore")


@pytest.mark.parametrize(
    "spec, why",
    [
        ("my_reward", "as a Hub model id"),  # a function's name (the tier runs offline: not in the cache either)
        ("rewards.py:my_reward", "as a Hub model id"),  # the CLI's syntax, not the API's
        ("accuracy_reward", "from trl.rewards import accuracy_reward"),
    ],
)
def test_a_string_that_is_no_loadable_model_says_what_reward_funcs_accepts(spec, why, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as err:
        checked_rewards([length_reward, spec], ["prompt"], "raise")
    message = str(err.value)
    assert message.startswith(f"reward_funcs entry {spec!r} is neither a function nor a loadable reward model (")
    assert "reward_funcs takes a function" in message and why in message


def test_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a folder without config.json"):
        checked_rewards(str(tmp_path), ["prompt"], "raise")
