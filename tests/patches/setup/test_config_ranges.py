"""patches/setup/config_ranges.py: every numeric field of the patched configs against its meaningful range, one table,
one
validator, run when the config is built (before any model loads); the message names config, field, value, range."""

import dataclasses

import pytest
import transformers

import slimrl
from slimrl.patches.setup import config_ranges
from slimrl.patches.setup.config_ranges import RULES, UNCHECKED, Range, check_ranges, rules_for


def _config_classes():
    from trl import DPOConfig, GRPOConfig, KTOConfig, RewardConfig, RLOOConfig, SFTConfig
    from trl.experimental.cpo import CPOConfig
    from trl.experimental.orpo import ORPOConfig

    from slimrl.ppo.config import PPOConfig

    return [GRPOConfig, RLOOConfig, DPOConfig, KTOConfig, ORPOConfig, CPOConfig, SFTConfig, RewardConfig, PPOConfig]


CONFIGS = {
    "grpo": ("trl", "GRPOConfig"),
    "rloo": ("trl", "RLOOConfig"),
    "dpo": ("trl", "DPOConfig"),
    "kto": ("trl", "KTOConfig"),
    "orpo": ("trl.experimental.orpo", "ORPOConfig"),
    "cpo": ("trl.experimental.cpo", "CPOConfig"),
}


def _config(algorithm: str, output_dir: str, **overrides):
    """The patched config of `algorithm` (small, CPU, fp32); `overrides` win."""
    import importlib

    module, name = CONFIGS[algorithm]
    kwargs = dict(output_dir=output_dir, bf16=False, report_to="none")
    if algorithm in ("grpo", "rloo"):
        kwargs.update(per_device_train_batch_size=4, num_generations=2, max_completion_length=8)
    slimrl.PatchFastRL(algorithm)
    try:
        return getattr(importlib.import_module(module), name)(**{**kwargs, **overrides})
    finally:
        slimrl.unpatch()


def _numeric(field: dataclasses.Field) -> bool:
    kind = str(field.type)
    return any(name in kind for name in ("int", "float")) and "dict" not in kind


def test_every_numeric_field_of_the_configs_is_ranged_or_says_why_not():
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    unaccounted = {
        f"{cls.__name__}.{f.name}"
        for cls in _config_classes()
        for f in dataclasses.fields(cls)
        if f.name not in base and _numeric(f) and f.name not in rules_for(cls) and f.name not in UNCHECKED
    }
    assert unaccounted == set()


def test_every_rule_decides_a_field_somewhere():
    decided = {id(rule) for cls in _config_classes() for rule in rules_for(cls).values()}
    assert [rule.field for rule in RULES if id(rule) not in decided] == []  # a typo'd field or config name
    assert not set(UNCHECKED) & {rule.field for rule in RULES}


@pytest.mark.parametrize(
    "allowed, inside, outside, text",
    [
        (config_ranges.POSITIVE, [1e-9, 5], [0, -1], "> 0"),
        (config_ranges.AT_LEAST_1, [1, 7], [0, -3], ">= 1"),
        (config_ranges.PROBABILITY_MASS, [1e-6, 1], [0, 1.5], "(0, 1]"),
        (Range(0, 0.5, high_open=True), [0, 0.49], [0.5, -0.1], "[0, 0.5)"),
    ],
)
def test_ranges_hold_their_ends(allowed, inside, outside, text):
    assert all(v in allowed for v in inside) and not any(v in allowed for v in outside)
    assert str(allowed) == text


@pytest.mark.parametrize(
    "algorithm, field, value, allowed",
    [
        ("grpo", "top_p", 0.0, "(0, 1]"),
        ("grpo", "top_p", 1.5, "(0, 1]"),
        ("grpo", "beta", -0.1, ">= 0"),
        ("grpo", "epsilon", 0.0, "> 0"),
        ("grpo", "num_iterations", 0, ">= 1"),
        ("grpo", "max_completion_length", 0, ">= 1"),
        ("grpo", "temperature", 0.0, "> 0"),
        ("grpo", "learning_rate", 2.0, "(0, 1]"),
        ("grpo", "gradient_accumulation_steps", 0, ">= 1"),
        ("rloo", "top_k", -1, ">= 0"),
        ("dpo", "beta", 0.0, "> 0"),
        ("dpo", "label_smoothing", 0.5, "[0, 0.5)"),
        ("kto", "undesirable_weight", 0.0, "> 0"),
        ("orpo", "beta", -1.0, ">= 0"),
        ("cpo", "max_length", 0, ">= 1"),
    ],
)
def test_a_value_out_of_range_names_config_field_value_and_range(tmp_path, algorithm, field, value, allowed):
    with pytest.raises(ValueError) as err:
        _config(algorithm, str(tmp_path), **{field: value})
    message = str(err.value)
    assert f"{field}={value!r} is out of range (allowed: {allowed}): " in message, message
    assert message.split(":")[0].endswith("Config")


@pytest.mark.parametrize(
    "algorithm, values",
    [
        ("grpo", dict(top_p=1.0, beta=0.0, epsilon=0.2, epsilon_high=None, top_k=0, num_iterations=1)),
        ("dpo", dict(beta=0.1, label_smoothing=0.0)),
        ("orpo", dict(beta=0.0)),
    ],
)
def test_values_at_the_edges_of_their_ranges_build(tmp_path, algorithm, values):  # the negative control
    config = _config(algorithm, str(tmp_path), **values)
    check_ranges(config)
    assert all(getattr(config, field) == value for field, value in values.items())


def test_orpo_beta_zero_is_allowed_but_dpo_beta_zero_is_not():
    from trl import DPOConfig
    from trl.experimental.orpo import ORPOConfig

    assert rules_for(ORPOConfig)["beta"].allowed == config_ranges.NON_NEGATIVE
    assert rules_for(DPOConfig)["beta"].allowed == config_ranges.POSITIVE


def test_ppo_values_are_checked_by_the_same_table(tmp_path):
    from slimrl.ppo.config import PPOConfig

    with pytest.raises(ValueError, match=r"PPOConfig: gamma=1\.5 is out of range \(allowed: \[0, 1\]\): the discount"):
        PPOConfig(output_dir=str(tmp_path), gamma=1.5, bf16=False)
    with pytest.raises(ValueError, match=r"PPOConfig: num_ppo_epochs=0 is out of range \(allowed: >= 1\)"):
        PPOConfig(output_dir=str(tmp_path), num_ppo_epochs=0, bf16=False)
