"""Every config keyword Unsloth's GRPO / DPO / ORPO / RL-game notebooks pass (with the values they pass), on slimrl's
patched TRL 1.16: accepted with its meaning (docs/unsloth-notebooks.md has the table). Keywords TRL 1.16 lacks are
checked where they land; the rest must reach the config unchanged."""

import importlib.util

import pytest

from slimrl.patches import registry

import _orpo_cpo_parity as O
import _pref_parity as H
import _rl_parity as R

GRPO = {  # keyword: the values the notebooks use
    "adam_beta1": [0.9],
    "adam_beta2": [0.99],
    "beta": [0.02],
    "delta": [1.5],
    "epsilon": [0.2],
    "epsilon_high": [0.28],
    "gradient_accumulation_steps": [1, 4],
    "gradient_checkpointing": [True],
    "importance_sampling_level": ["sequence"],
    "learning_rate": [5e-6, 2e-4],
    "log_completions": [False],
    "logging_steps": [1],
    "loss_type": ["dr_grpo", "bnpo"],
    "lr_scheduler_type": ["linear", "cosine"],
    "mask_truncated_completions": [True, False],
    "max_completion_length": [200],
    "max_grad_norm": [0.1],
    "max_prompt_length": [256],
    "max_steps": [100],
    "num_generations": [2, 4, 8],
    "num_train_epochs": [1, 0.5],
    "optim": ["adamw_8bit", "paged_adamw_8bit", "adamw_torch_fused"],
    "per_device_train_batch_size": [1, 4],
    "report_to": ["none"],
    "save_steps": [100],
    "temperature": [1.0],
    "top_k": [64],
    "top_p": [0.95],
    "use_vllm": [True],
    "warmup_ratio": [0.1, 0.0],
    "warmup_steps": [10],
    "weight_decay": [0.001],
}
DPO = {
    "gradient_accumulation_steps": [4],
    "learning_rate": [5e-6],
    "logging_steps": [1],
    "lr_scheduler_type": ["linear"],
    "num_train_epochs": [3],
    "optim": ["adamw_8bit"],
    "per_device_train_batch_size": [2],
    "report_to": ["none"],
    "seed": [42],
    "warmup_ratio": [0.1],
    "weight_decay": [0.0],
}
ORPO = {
    "beta": [0.1],
    "gradient_accumulation_steps": [4],
    "logging_steps": [1],
    "lr_scheduler_type": ["linear"],
    "max_completion_length": [64],
    "max_length": [128],
    "max_prompt_length": [64],
    "max_steps": [30],
    "optim": ["adamw_8bit"],
    "per_device_train_batch_size": [2],
    "report_to": ["none"],
}
# Keywords stored differently: (field where the value lands, the value there)
LANDS_AS = {
    "warmup_ratio": ("warmup_steps", float),  # transformers 5's fractional warmup_steps (slimrl's mapping)
    "report_to": ("report_to", lambda value: [] if value == "none" else value),  # transformers' own normalisation
}


def _cases(algorithm, table):
    return [(algorithm, key, value) for key, values in table.items() for value in values]


@pytest.mark.parametrize(
    "algorithm, keyword, value", [*_cases("grpo", GRPO), *_cases("dpo", DPO), *_cases("orpo", ORPO)]
)
def test_notebook_config_keyword(algorithm, keyword, value, tmp_path, unpatched):
    registry.PatchFastRL(algorithm)
    harness = {"grpo": R, "dpo": H, "orpo": O}[algorithm]
    base = {"per_device_train_batch_size": 2, "num_generations": 2} if algorithm == "grpo" else {}
    config = harness.make_config(algorithm, str(tmp_path), **{**base, keyword: value})
    field, convert = LANDS_AS.get(keyword, (keyword, lambda v: v))
    assert getattr(config, field) == convert(value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm.SamplingParams needs vLLM installed")
def test_notebook_vllm_sampling_params(tmp_path, unpatched):
    from vllm import SamplingParams

    registry.PatchFastRL("grpo")
    params = SamplingParams(min_p=0.1, top_p=1.0, top_k=-1, seed=3407, stop=["<|im_end|>"])
    config = R.make_config("grpo", str(tmp_path), vllm_sampling_params=params, num_generations=2)
    assert config.vllm_sampling_params is params
