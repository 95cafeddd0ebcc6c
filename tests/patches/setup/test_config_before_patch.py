"""A TRL config built before slimrl patched TRL (or through `dataclasses.replace`) works with a patched trainer: every
slimrl field it lacks reads its declared default, and one training step runs."""

import pytest

from slimrl.patches import registry
from slimrl.patches.setup.config_setup import config_defaults
from slimrl.patches.trainers.online import ONLINE

import _orpo_cpo_parity as O
import _pref_parity as H
import _rl_parity as R
import _tiny as T


def _online_step(algorithm, config):
    trainer = R.build_trainer(algorithm, T.tiny_model(), config)
    trace = R.Trace()
    R.micro_step(trainer, R.generation_batch(config), 0, trace)
    return trainer, trace


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_online_config_from_before_the_patch_trains(algorithm, tmp_path, unpatched):
    config = R.make_config(algorithm, str(tmp_path), beta=0.0)  # no reference model to load by name
    assert not hasattr(config, "slimrl_reward_errors")  # negative control: stock TRL's config has no slimrl field
    registry.PatchFastRL(algorithm)
    for name, default in config_defaults(ONLINE):
        assert getattr(config, name) == default, name
    trainer, trace = _online_step(algorithm, config)
    assert trace.losses and trainer.args is config
    assert "peak_memory_gb" in trainer._metrics["train"]  # slimrl's training step ran


def test_instance_value_wins_over_the_class_default(tmp_path, unpatched):
    registry.PatchFastRL("grpo")
    config = R.make_config("grpo", str(tmp_path), slimrl_reward_errors="skip")
    assert config.slimrl_reward_errors == "skip" and type(config).slimrl_reward_errors == "raise"
    del config.slimrl_reward_errors  # what a config built without slimrl's __init__ looks like
    assert config.slimrl_reward_errors == "raise"


def test_unpatch_removes_the_defaults(tmp_path, unpatched):
    config = R.make_config("grpo", str(tmp_path))
    registry.PatchFastRL("grpo")
    registry.unpatch()
    assert not hasattr(config, "slimrl_reward_errors") and not hasattr(type(config), "slimrl_num_chunks")


@pytest.mark.parametrize("algorithm", ["dpo", "orpo"])
def test_offline_config_from_before_the_patch_trains(algorithm, tmp_path, unpatched):
    harness = H if algorithm == "dpo" else O
    config = harness.make_config(algorithm, str(tmp_path))
    registry.PatchFastRL(algorithm)
    assert config.slimrl_shared_prefix == "auto" and config.slimrl_num_chunks == -1
    trainer = harness.build_trainer(algorithm, T.peft_model(), config)  # reference: the adapter disabled
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.training_step(trainer.model, batch, None)
    assert float(loss) == float(loss)  # a number, not NaN
