"""Reward-model parity: PatchFastRL("reward") leaves TRL's numbers unchanged over 2 SGD steps (loss, gradients,
logged metrics), and adds `peak_memory_gb`.

RewardTrainer trains a sequence-classification model (no LM head), so the patch is set-up, checks and the metric
only; these tests guard that it changes nothing else. Cases: LoRA (SEQ_CLS, score head trained) and full
fine-tuning with center_rewards_coefficient; batch 3 x 1 and 2 x 2 accumulation.
"""

import pytest

import _pref_parity as H
import _tiny as T

ALGO = "reward"

CASES = {
    "lora": (dict(per_device_train_batch_size=3), True),
    "full-ga2-centered": (
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, center_rewards_coefficient=0.01),
        False,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reward_matches_stock(case, tmp_path, unpatched):
    config, lora = CASES[case]
    peft = T.lora_config(task_type="SEQ_CLS") if lora else None
    trainers = H.build_sides(ALGO, lambda: H.tiny_reward_model(0), config, str(tmp_path), peft_config=peft)
    traces = H.run_sides(ALGO, trainers)
    H.assert_traces_match(traces)
    s = traces.stock
    assert any("score" in name for name in s.grads[0]), "the score head trains"
    assert all(loss != 0 for loss in s.losses)
