"""A TRL config's `gradient_checkpointing_kwargs={"offload": True}` (transformers' own activation offload) under
PatchFastRL: the layer inputs stay offloaded through every step.

Stock TRL 1.16 turns checkpointing off around its no-grad scoring pass and back on with the raw keyword dict
(`trl.models.utils.disable_gradient_checkpointing`), so transformers' offload wrapper is gone before the first loss and
`offload=True` is passed on to each layer's forward, which ignores it. The first test shows that on stock TRL (the
reason for the patch: if TRL fixes it, it fails); patched, the model runs slimrl's "offload" mode.
"""

import logging

import pytest
import torch

from slimrl import PatchFastRL
from slimrl.models.checkpointing import base_transformers_model, checkpointing_mode
from slimrl.state import model_state
from slimrl.testing import tiny_llama, tiny_tokenizer

LAYERS = 2
QUIET_CPU = dict(use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True)


def _config_fields(offload: bool = True) -> dict:
    """The config's checkpointing fields; `offload` asks for transformers' own activation offload."""
    kwargs = {"use_reentrant": False, "offload": True} if offload else {"use_reentrant": False}
    return dict(QUIET_CPU, gradient_checkpointing=True, gradient_checkpointing_kwargs=kwargs)


def _trainer(tmp_path, offload: bool = True):
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=1,
        **_config_fields(offload),
    )
    return GRPOTrainer(
        model=tiny_llama(seed=0, hidden_size=32, num_layers=LAYERS),
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        train_dataset=_prompts(),
        processing_class=tiny_tokenizer(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )


def _prompts():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": "what is 1 plus 2"}]}] * 8)


def _layer_checkpoint_function(trainer):
    base = base_transformers_model(trainer.model)
    layer = base.model.layers[-1]
    assert layer.gradient_checkpointing
    return layer._gradient_checkpointing_func


def test_stock_trl_drops_the_offload_before_the_first_loss(tmp_path, unpatched):
    trainer = _trainer(tmp_path)
    trainer.train()
    function = _layer_checkpoint_function(trainer)
    assert function.func is torch.utils.checkpoint.checkpoint  # no offloading wrapper left
    assert function.keywords.get("offload") is True  # the key handed on to the layer's forward


def test_patched_trainer_keeps_the_layer_inputs_offloaded(tmp_path, unpatched, caplog):
    PatchFastRL("grpo")
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        trainer = _trainer(tmp_path)
    assert "offload=True" in caplog.text and "keeps them offloaded" in caplog.text
    assert checkpointing_mode(trainer.model) == "offload"
    trainer.train()
    assert checkpointing_mode(trainer.model) == "offload"
    stats = model_state(base_transformers_model(trainer.model)).offload_stats
    assert stats.tensors_seen == LAYERS  # every layer's input, in the step's one training forward


def test_patched_trainer_leaves_a_config_without_offload_alone(tmp_path, unpatched):
    PatchFastRL("grpo")
    trainer = _trainer(tmp_path, offload=False)
    assert checkpointing_mode(trainer.model) is None


@pytest.mark.parametrize("flag", [False, True])
def test_offload_asked_only_with_checkpointing_on(flag, tmp_path):
    from trl import GRPOConfig

    from slimrl.models.checkpointing import CONFIG_OFFLOAD
    from slimrl.patches.setup.trainer_setup import config_checkpointing

    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        gradient_checkpointing=flag,
        gradient_checkpointing_kwargs={"offload": True},
    )
    assert (config_checkpointing(args).row == CONFIG_OFFLOAD) is flag


def test_patched_dpo_keeps_the_layer_inputs_offloaded(tmp_path, unpatched):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    PatchFastRL("dpo")
    pairs = Dataset.from_list([{"prompt": "what is 1 plus 2", "chosen": " 3", "rejected": " 4"}] * 4)
    args = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1, **_config_fields())
    trainer = DPOTrainer(
        model=tiny_llama(seed=0, hidden_size=32, num_layers=LAYERS),
        args=args,
        train_dataset=pairs,
        processing_class=tiny_tokenizer(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    trainer.train()  # TRL's reference pass (adapter off, no grad) toggles checkpointing before the loss
    assert checkpointing_mode(trainer.model) == "offload"
    assert model_state(base_transformers_model(trainer.model)).offload_stats.tensors_seen == LAYERS
