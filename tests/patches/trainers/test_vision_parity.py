"""Patched GRPO / DPO ≡ stock TRL 1.16 on image-text models (tiny random Gemma 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL):
same rollouts, losses, gradients, parameters and metrics over 2 steps by the rule of _parity, with image prompts.

The patched side runs slimrl's lean head on the language model's hidden states and encodes each distinct prompt image
once per forward (rollout prefill, old-policy / reference / loss forwards; DPO's chosen and rejected rows share
their prompt's image): the tests also check how many images the vision tower was handed and how many it encoded.
LoRA goes on language layers, and in one case on the vision tower too (its gradient then arrives through the shared
encoding). Negative control: the same run with sharing switched off encodes every row's image.
"""

import pytest
import torch

from slimrl.patches.scoring.shared_prefix import shared_prefix_stats

import _tiny as T
import _vision_parity as V

LANGUAGE_LORA = dict(target_modules=["q_proj", "v_proj", "gate_proj"])
VISION_TOO = {  # the vision tower's attention and MLP Linears of each family, with the language layers'
    "qwen2_vl": ["q_proj", "v_proj", "qkv", "fc1"],
    "gemma3": ["q_proj", "v_proj", "fc1"],
}
GRPO = dict(per_device_train_batch_size=4, num_generations=2, beta=0.04, num_iterations=2, max_completion_length=5)
DPO = dict(per_device_train_batch_size=3)


def _check_images(trainer, per_image_rows: int, sharing: bool = True):
    stats = shared_prefix_stats(trainer)
    assert stats.images_given > 0
    expected = stats.images_given // per_image_rows if sharing else stats.images_given
    assert stats.images_encoded == expected, stats


def _grpo_case(tmp_path, kind, targets=None, patched_config=None):
    lora = T.lora_config(target_modules=targets or LANGUAGE_LORA["target_modules"])
    trainers = V.build_sides("grpo", kind, GRPO, str(tmp_path), lora, patched_config)
    traces = V.run_sides("grpo", trainers)
    V.assert_traces_match("grpo", traces)
    return trainers, traces


@pytest.mark.parametrize("kind", ["qwen2_vl", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_grpo_image_prompts_match_stock(tmp_path, unpatched, kind):
    trainers, traces = _grpo_case(tmp_path, kind)
    assert T.head_file(trainers.patched).endswith("slimrl/ops/logprob.py")
    _check_images(trainers.patched, GRPO["num_generations"])
    assert any(loss != 0 for loss in traces.stock.losses)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_grpo_other_families_match_stock(tmp_path, unpatched, kind):
    trainers, _ = _grpo_case(tmp_path, kind)
    _check_images(trainers.patched, GRPO["num_generations"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2_vl", "gemma3"])
def test_grpo_lora_on_the_vision_tower_matches_stock(tmp_path, unpatched, kind):
    trainers, traces = _grpo_case(tmp_path, kind, VISION_TOO[kind])
    vision_grads = [n for n in traces.stock.grads[0] if ".visual." in n or ".vision_tower." in n]
    assert vision_grads and all(n in traces.patched.grads[0] for n in vision_grads)
    _check_images(trainers.patched, GRPO["num_generations"])


@pytest.mark.slow
def test_sharing_off_encodes_every_row(tmp_path, unpatched):
    trainers, _ = _grpo_case(tmp_path, "qwen2_vl", patched_config={"slimrl_shared_prefix": False})
    assert shared_prefix_stats(trainers.patched).images_given == 0  # nothing installed, nothing counted


@pytest.mark.parametrize("kind", ["qwen2_vl", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_dpo_image_prompts_match_stock(tmp_path, unpatched, kind):
    trainers = V.build_sides("dpo", kind, DPO, str(tmp_path), T.lora_config(**LANGUAGE_LORA))
    traces = V.run_sides("dpo", trainers)
    V.assert_traces_match("dpo", traces)
    assert "pixel_values" in traces.stock.inputs[0]
    _check_images(trainers.patched, 2)  # chosen and rejected rows show their prompt's image
    assert all(torch.isfinite(torch.tensor(traces.patched.losses)))
