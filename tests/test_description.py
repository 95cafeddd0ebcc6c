"""`slimrl.describe(obj).counters`: what the memory levers did, read from the slimrl state of a trainer or a model, as
plain dicts copied when `describe` is called (None for a lever that has not run); printed with the description."""

import types
from collections import Counter

import torch

import slimrl
from slimrl.models.tiled_mlp import tile_mlp, tiled_mlp_state
from slimrl.patches.scoring.padding_free import padding_free_stats
from slimrl.patches.scoring.row_groups import row_group_stats
from slimrl.testing import tiny_llama

LEVERS = ["row_groups", "padding_free", "shared_prefix", "tiled_mlp", "activation_offload"]


def _trainer(model):
    """What describe() takes for a trainer: an object with an accelerator, args and a model."""
    return types.SimpleNamespace(accelerator=object(), args=None, model=model)


def test_nothing_ran_nothing_counted():
    described = slimrl.describe(_trainer(tiny_llama(hidden_size=32, num_layers=2)))
    assert list(described.counters) == LEVERS
    assert all(values is None for values in described.counters.values())
    assert "counter" not in str(described)


def test_trainer_counters_are_the_levers_counts():
    model = tile_mlp(tiny_llama(hidden_size=32, num_layers=2), 4)  # tiles every call longer than 4 tokens
    trainer = _trainer(model)
    ids = torch.randint(4, 100, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    stats = row_group_stats(trainer)
    stats.grouped_steps, stats.groups, stats.reasons = 1, 3, Counter({"one group was enough": 2})
    padding_free_stats(trainer).trimmed_calls = 5

    counters = slimrl.describe(trainer).counters
    assert counters["row_groups"] == {
        "grouped_steps": 1,
        "groups": 3,
        "whole_steps": 0,
        "grouped_passes": 0,
        "reasons": {"one group was enough": 2},
    }
    assert type(counters["row_groups"]["reasons"]) is dict
    assert counters["padding_free"]["trimmed_calls"] == 5 and counters["shared_prefix"] is None
    tiled = tiled_mlp_state(model)
    assert tiled.tiled_calls == 2  # one call per layer, with grad
    assert counters["tiled_mlp"] == {
        "setting": 4,
        "hidden": 32,
        "intermediate": tiled.intermediate,
        "modules": 2,
        "tiled_calls": 2,
        "sharded_calls": 0,
        "largest_call": 16,
        "activation_bytes": 4,
    }
    stats.groups = 99  # a copy: later steps do not change a description already taken
    assert counters["row_groups"]["groups"] == 3
    assert "counter  row_groups:" in str(slimrl.describe(trainer)) and "'groups': 99" in str(slimrl.describe(trainer))


def test_a_model_has_its_own_counters_and_a_tokenizer_none():
    model = tile_mlp(tiny_llama(hidden_size=32, num_layers=2), True)
    assert slimrl.describe(model).counters == {
        "tiled_mlp": {
            "setting": True,
            "hidden": 32,
            "intermediate": 64,
            "modules": 2,
            "tiled_calls": 0,
            "sharded_calls": 0,
            "largest_call": 0,
            "activation_bytes": 0,
        },
        "activation_offload": None,
    }
    assert slimrl.describe(types.SimpleNamespace(vocab_size=10)).counters == {}


def test_config_rules_lists_the_range_table():
    from trl import DPOConfig, GRPOConfig

    from slimrl.patches.setup.config_ranges import RULES, rules_for

    assert slimrl.config_rules() is RULES and len(RULES) > 50
    assert slimrl.config_rules(DPOConfig) == tuple(rules_for(DPOConfig).values())
    grpo_beta = {rule.field: rule for rule in slimrl.config_rules(GRPOConfig(output_dir="x", bf16=False))}["beta"]
    dpo_beta = {rule.field: rule for rule in slimrl.config_rules(DPOConfig)}["beta"]
    assert 0 in grpo_beta.allowed and 0 not in dpo_beta.allowed  # the same name, two meanings
