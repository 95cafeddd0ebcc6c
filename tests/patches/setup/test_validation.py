"""Each validation error and warning of the patched RL configs and trainers, and precision resolution."""

import types
import warnings

import pytest
import torch
from datasets import Dataset

import slimrl
from slimrl.patches.setup import precision, validation
from slimrl.state import config_state
from slimrl.testing import tiny_llama, tiny_tokenizer


@pytest.fixture
def grpo():
    slimrl.PatchFastRL("grpo")
    from trl import GRPOConfig, GRPOTrainer

    yield GRPOConfig, GRPOTrainer
    slimrl.unpatch()


def _cfg(GRPOConfig, tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        report_to="none",
        max_completion_length=8,
    )
    base.update(kw)
    return GRPOConfig(**base)


@pytest.mark.parametrize("lr", [0.0, -1e-5, 1.5])
def test_learning_rate_out_of_range_is_an_error(grpo, tmp_path, lr):
    with pytest.raises(ValueError, match=rf"learning_rate={lr}"):
        _cfg(grpo[0], tmp_path, learning_rate=lr)


@pytest.mark.parametrize("lr", [1e-9, 0.05])
def test_unusual_learning_rate_warns(grpo, tmp_path, lr):
    with pytest.warns(UserWarning, match=r"learning_rate=.*outside"):
        _cfg(grpo[0], tmp_path, learning_rate=lr)


def test_usual_learning_rate_is_silent(grpo, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _cfg(grpo[0], tmp_path, learning_rate=1e-5)


def test_batch_not_divisible_with_explicit_steps_names_working_values(grpo, tmp_path):
    with pytest.raises(ValueError) as err:
        _cfg(grpo[0], tmp_path, per_device_train_batch_size=3, steps_per_generation=2, num_generations=4)
    msg = str(err.value)
    assert "per_device_train_batch_size (3) × steps_per_generation (2) × world size (1) = 6" in msg
    assert "per_device_train_batch_size in [2, 4, 6, 8]" in msg and "num_generations in [2, 3, 6]" in msg


def test_batch_not_divisible_left_to_trl_is_fitted_keeping_the_micro_batch(grpo, tmp_path, caplog):
    cfg = _cfg(grpo[0], tmp_path, per_device_train_batch_size=3, gradient_accumulation_steps=2, num_generations=4)
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (3, 2)
    assert (cfg.steps_per_generation, cfg.generation_batch_size) == (4, 12)  # lcm(3, 4): 3 prompts x 4 completions


def test_batch_divisible_through_accumulation(grpo, tmp_path):
    cfg = _cfg(grpo[0], tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=4, num_generations=4)
    assert cfg.generation_batch_size == 4


@pytest.mark.parametrize("t", [0.0, -0.5])
def test_temperature_must_be_positive(grpo, tmp_path, t):
    with pytest.raises(ValueError, match=rf"temperature={t}"):
        _cfg(grpo[0], tmp_path, temperature=t)


def test_num_chunks_alias_and_validation(grpo, tmp_path):
    assert _cfg(grpo[0], tmp_path).slimrl_num_chunks == -1
    assert _cfg(grpo[0], tmp_path, unsloth_num_chunks=3).slimrl_num_chunks == 3
    with pytest.raises(ValueError, match="disagree"):
        _cfg(grpo[0], tmp_path, unsloth_num_chunks=3, slimrl_num_chunks=2)
    with pytest.raises(ValueError, match="slimrl_num_chunks must be"):
        _cfg(grpo[0], tmp_path, slimrl_num_chunks=0)


needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only precision path")


@needs_cpu_only
def test_bare_config_builds_on_cpu(grpo, tmp_path):
    cfg = _cfg(grpo[0], tmp_path)
    assert cfg.bf16 is False and cfg.mixed_precision == "no"
    assert config_state(cfg).auto_precision


@needs_cpu_only
def test_use_cpu_keeps_trl_default(grpo, tmp_path):
    cfg = _cfg(grpo[0], tmp_path, use_cpu=True)
    assert cfg.bf16 is True and not config_state(cfg).auto_precision


@needs_cpu_only
def test_explicit_bf16_without_gpu_names_the_fix(grpo, tmp_path):
    with pytest.raises(ValueError, match=r"bf16=True but no GPU.*use_cpu=True"):
        _cfg(grpo[0], tmp_path, bf16=True)


@needs_cpu_only
def test_explicit_fp16_on_cpu_is_an_error(grpo, tmp_path):
    with pytest.raises(ValueError, match=r"fp16=True needs a CUDA GPU"):
        _cfg(grpo[0], tmp_path, fp16=True, bf16=False)


def test_flags_contradicting_weights():
    model16 = tiny_llama(dtype=torch.float16)
    model_bf = tiny_llama(dtype=torch.bfloat16)
    args = types.SimpleNamespace(bf16=True, fp16=False, use_cpu=True)
    with pytest.raises(ValueError, match=r"bf16=True but the model's weights are float16: set fp16=True"):
        precision.resolve_trainer_precision(args, model16)
    args = types.SimpleNamespace(bf16=False, fp16=True, use_cpu=False)
    with pytest.raises(ValueError, match=r"fp16=True but the model's weights are bfloat16: set bf16=True"):
        precision.resolve_trainer_precision(args, model_bf)


@needs_cpu_only
def test_auto_precision_on_cpu_follows_weights():
    args = types.SimpleNamespace(bf16=False, fp16=False, use_cpu=False, mixed_precision="no")
    config_state(args).auto_precision = True
    precision.resolve_trainer_precision(args, tiny_llama(dtype=torch.bfloat16))
    assert (args.bf16, args.fp16, args.mixed_precision) == (False, False, "no")


def _reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def _trainer(GRPOConfig, GRPOTrainer, tmp_path, model, dataset, **cfg):
    return GRPOTrainer(
        model=model,
        reward_funcs=_reward,
        args=_cfg(GRPOConfig, tmp_path, **cfg),
        train_dataset=dataset,
        processing_class=tiny_tokenizer(),
    )


def test_trainer_rejects_flags_contradicting_weights(grpo, tmp_path):
    ds = Dataset.from_dict({"prompt": ["what is 1 + 2 ?"] * 4})
    with pytest.raises(ValueError, match=r"weights are float16"):
        _trainer(*grpo, tmp_path, tiny_llama(dtype=torch.float16), ds, use_cpu=True, bf16=True)


def test_max_seq_length_against_completion(grpo, tmp_path):
    model = tiny_llama()
    model.max_seq_length = 8
    ds = Dataset.from_dict({"prompt": ["hi"] * 4})
    with pytest.raises(ValueError, match=r"max_completion_length \(8\) leaves no room.*max_seq_length \(8\)"):
        _trainer(*grpo, tmp_path, model, ds)


def test_max_seq_length_against_longest_prompt(grpo, tmp_path):
    model = tiny_llama()
    model.max_seq_length = 20
    ds = Dataset.from_dict({"prompt": ["what is 1 + 2 ?", " ".join(["the"] * 30), "hi", "yes"]})
    with pytest.raises(ValueError, match=r"1 prompt\(s\) in train_dataset \(the longest 30 tokens\)"):
        _trainer(*grpo, tmp_path, model, ds)


def test_rollout_length_check():
    model = types.SimpleNamespace(max_seq_length=10)
    validation.check_rollout_lengths(model, [[1] * 4, [1] * 2], 6)
    with pytest.raises(ValueError, match=r"A prompt of 5 tokens plus max_completion_length \(6\)"):
        validation.check_rollout_lengths(model, [[1] * 5], 6)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the case of a machine without an accelerator")
def test_pin_memory_is_off_without_an_accelerator_unless_set(grpo, tmp_path):
    def pin_memory_warnings(pin: bool):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(torch.utils.data.DataLoader(list(range(4)), batch_size=2, pin_memory=pin))
        return [w for w in caught if "pin_memory" in str(w.message)]

    args = _cfg(grpo[0], tmp_path)
    assert args.dataloader_pin_memory is False and pin_memory_warnings(args.dataloader_pin_memory) == []
    assert pin_memory_warnings(True)  # control: what torch says with TRL's default
    assert _cfg(grpo[0], tmp_path, dataloader_pin_memory=True).dataloader_pin_memory is True  # the user's value kept


def _cuda_without_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)


def test_explicit_fp16_false_is_kept_on_a_gpu_without_bf16(monkeypatch):
    """The user's fp16=False (bf16 unset) on CUDA without bf16: bf16 is filled, fp16 stays the user's."""
    _cuda_without_bf16(monkeypatch)
    args = types.SimpleNamespace(bf16=None, fp16=False, use_cpu=False, mixed_precision="no")
    config_state(args).user_fields = frozenset({"fp16"})
    precision.resolve_config_precision(args)
    precision.resolve_trainer_precision(args, tiny_llama(dtype=torch.float32))
    assert (args.bf16, args.fp16, args.mixed_precision) == (False, False, "no")


def test_unset_flags_on_a_gpu_without_bf16_pick_fp16(monkeypatch):
    """Neither flag set: slimrl picks fp16 from the fp32 weights, as before."""
    _cuda_without_bf16(monkeypatch)
    args = types.SimpleNamespace(bf16=None, fp16=False, use_cpu=False, mixed_precision="no")
    config_state(args).user_fields = frozenset()
    precision.resolve_config_precision(args)
    precision.resolve_trainer_precision(args, tiny_llama(dtype=torch.float32))
    assert (args.bf16, args.fp16, args.mixed_precision) == (False, True, "fp16")
