"""Set-up checks of the patched offline trainers (DPO, KTO, SFT, reward): config building on CPU, learning rate,
the chunk knob, `max_length` vs the model's `max_seq_length`, and TRL's activation offloading vs the model's
"offload" checkpointing."""

import contextlib
import warnings

import pytest
import torch

import slimrl
from slimrl.models.checkpointing import apply_checkpointing, checkpointing_mode

import _pref_parity as H
import _tiny as T

ALGOS = ["dpo", "kto", "sft", "reward"]


@pytest.fixture
def patched():
    slimrl.unpatch()
    yield
    slimrl.unpatch()


@pytest.mark.parametrize("algo", ALGOS)
def test_bare_config_builds_on_cpu_and_takes_the_knob(algo, tmp_path, patched):
    config_cls, _ = H.trl_classes(algo)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="bf16"):  # stock TRL's default cannot run here
            config_cls(output_dir=str(tmp_path))
    slimrl.PatchFastRL(algo)
    args = config_cls(output_dir=str(tmp_path), unsloth_num_chunks=3)
    assert args.slimrl_num_chunks == 3 and config_cls(output_dir=str(tmp_path)).slimrl_num_chunks == -1
    with pytest.raises(ValueError, match="disagree"):
        config_cls(output_dir=str(tmp_path), slimrl_num_chunks=2, unsloth_num_chunks=3)


@pytest.mark.parametrize("algo", ["dpo", "sft"])
def test_learning_rate_checks(algo, tmp_path, patched):
    slimrl.PatchFastRL(algo)
    config_cls, _ = H.trl_classes(algo)
    with pytest.raises(ValueError, match=r"learning_rate=0\.0"):
        config_cls(output_dir=str(tmp_path), learning_rate=0.0)
    with pytest.warns(UserWarning, match=r"learning_rate=0\.05 is outside"):
        config_cls(output_dir=str(tmp_path), learning_rate=0.05)


def _model(max_seq_length=None):
    model = T.tiny_model(0)
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length  # what FastLanguageModel.from_pretrained sets
    return model


@pytest.mark.parametrize("algo", ["dpo", "sft"])
def test_max_length_beyond_max_seq_length_is_an_error(algo, tmp_path, patched):
    slimrl.PatchFastRL(algo)
    args = H.make_config(algo, str(tmp_path), max_length=64)
    with pytest.raises(ValueError, match=r"max_length=64 in the config exceeds the model's max_seq_length=32"):
        H.build_trainer(algo, _model(32), args)


def test_default_max_length_follows_the_model_and_smaller_is_kept(tmp_path, patched):
    slimrl.PatchFastRL("dpo")
    from trl import DPOConfig

    args = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, report_to="none")
    assert args.max_length == 1024
    trainer = H.build_trainer("dpo", _model(32), args, T.lora_config())
    assert trainer.args.max_length == 32 and trainer.data_collator.max_length == 32
    kept = H.build_trainer("dpo", _model(32), H.make_config("dpo", str(tmp_path), max_length=20), T.lora_config())
    assert kept.args.max_length == 20


def _fake_offloading(monkeypatch):
    """TRL's activation offloading needs an accelerator; on CPU stand in a marker context for it."""
    import trl.trainer.dpo_trainer as dpo_mod

    marker = contextlib.nullcontext()
    monkeypatch.setattr(dpo_mod, "get_act_offloading_ctx_manager", lambda model, **kw: marker)
    return marker


def test_trl_activation_offloading_with_offload_mode_warns_and_checkpoints_once(tmp_path, patched, monkeypatch):
    marker = _fake_offloading(monkeypatch)
    slimrl.PatchFastRL("dpo")
    model = apply_checkpointing(_model(), "offload")
    args = H.make_config("dpo", str(tmp_path), activation_offloading=True, gradient_checkpointing=True)
    with pytest.warns(UserWarning, match=r"activation_offloading=True .* use_gradient_checkpointing='offload'"):
        trainer = H.build_trainer("dpo", model, args, T.lora_config())
    assert trainer.maybe_activation_offload_context is marker, "TRL's activation offloading stays on"
    assert checkpointing_mode(model) is True and trainer.args.gradient_checkpointing


def test_trl_activation_offloading_alone_is_untouched(tmp_path, patched, monkeypatch):
    marker = _fake_offloading(monkeypatch)
    slimrl.PatchFastRL("dpo")
    model = apply_checkpointing(_model(), True)
    args = H.make_config("dpo", str(tmp_path), activation_offloading=True, gradient_checkpointing=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer = H.build_trainer("dpo", model, args, T.lora_config())
    assert trainer.maybe_activation_offload_context is marker and checkpointing_mode(model) is True


def test_offload_mode_is_applied_after_trainer_init(tmp_path, patched):
    slimrl.PatchFastRL("sft")
    model = apply_checkpointing(_model(), "offload")
    trainer = H.build_trainer("sft", model, H.make_config("sft", str(tmp_path), gradient_checkpointing=True))
    assert checkpointing_mode(trainer.model) == "offload"
    assert model.__dict__["gradient_checkpointing_enable"].__func__.__name__ == "_pinned_gradient_checkpointing_enable"


def test_reward_num_chunks_has_no_effect_and_says_so(tmp_path, patched):
    slimrl.PatchFastRL("reward")
    args = H.make_config("reward", str(tmp_path), slimrl_num_chunks=2)
    with pytest.warns(UserWarning, match="slimrl_num_chunks=2 has no effect"):
        H.build_trainer("reward", H.tiny_reward_model(0), args)
