"""Patched CPOTrainer ≡ stock TRL 1.16 experimental CPOTrainer for every loss type (loss, gradients, every logged
metric over 2 optimizer steps), without [2B, T, V] logits.

Loss types sigmoid (with label smoothing), hinge, ipo, simpo (cpo_alpha != 0, simpo_gamma), AlphaPO (`alpha != 0`,
"alphapo" sugar = simpo with cpo_alpha 0), cpo_alpha = 0 (stock's constant NLL); LoRA and full fine-tuning; prompts,
chosen and rejected of different lengths; batches of 3 and 2 pairs, gradient accumulation.
"""

import types

import pytest

import _orpo_cpo_parity as H
import _tiny as T

ALGO = "cpo"

CASES = {
    "sigmoid-smoothing-full": (False, dict(loss_type="sigmoid", label_smoothing=0.1)),
    "hinge-lora": (True, dict(loss_type="hinge", beta=0.2)),
    "ipo-alpha0-full-ga2": (
        False,
        dict(loss_type="ipo", cpo_alpha=0.0, gradient_accumulation_steps=2, per_device_train_batch_size=2),
    ),
    "simpo-cpoalpha-lora": (True, dict(loss_type="simpo", cpo_alpha=0.5, simpo_gamma=0.3)),
    "simpo-cpoalpha-full": (False, dict(loss_type="simpo", cpo_alpha=2.0)),
    "alphapo-full": (False, dict(loss_type="alphapo", alpha=0.3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cpo_parity(tmp_path, unpatched, case):
    lora, config = CASES[case]
    trainers = H.build_sides(ALGO, lambda: T.tiny_model(0), config, str(tmp_path), H.lora_config() if lora else None)
    stock = trainers.stock
    traces = H.run_sides(ALGO, trainers)
    H.assert_traces_match(traces)
    s = traces.stock
    assert {"nll_loss", "logits/chosen", "logits/rejected", "logps/chosen", "rewards/margins"} <= set(s.metrics)
    if stock.cpo_alpha == 0:
        assert set(s.metrics["nll_loss"]) == {0.0}
    else:
        assert min(s.metrics["nll_loss"]) > 0
    assert s.losses[0] != s.losses[-1], "the SGD step should move the loss"


def test_encoder_decoder_calls_stock_with_warning(unpatched):
    from slimrl.patches.scoring.concatenated_forward import concatenated_forward_maker
    from slimrl.patches.trainers.cpo import CPO

    trainer = types.SimpleNamespace(is_encoder_decoder=True, args=types.SimpleNamespace(slimrl_shared_prefix=False))
    with pytest.warns(UserWarning, match="CPOTrainer.*encoder-decoder"):
        result = concatenated_forward_maker(CPO)(lambda self, model, batch: ("stock", self))(trainer, None, None)
    assert result == ("stock", trainer)
