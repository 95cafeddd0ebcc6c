"""Precision resolution on CUDA (slimrl.patches.setup.precision, slimrl.models.dtypes.choose_dtype): where TRL's
default
works (a bf16 GPU) it is kept; flags the user set are kept or, when they contradict the weights, raise; the automatic
choice (only where TRL's default cannot run) follows the weights; and trainers really run in what was resolved."""

import types

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.patches.setup import precision
from slimrl.state import ConfigState, config_state
from slimrl.testing import tiny_llama

from _gpu_helpers import MARKS, cuda_config, grpo_step, grpo_trainer, patched_state, trainable

pytestmark = MARKS


def _grpo_config(tmp_path, **flags):
    import trl

    with patched_state("grpo"):
        return trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", **flags)


def test_bare_config_keeps_trls_bf16_default_on_a_bf16_gpu(tmp_path, unpatched):
    assert torch.cuda.is_bf16_supported(), "these checks assume a GPU with bf16 (Ampere or newer)"
    cfg = _grpo_config(tmp_path)
    assert cfg.bf16 is True and not cfg.fp16 and not config_state(cfg).auto_precision


@pytest.mark.parametrize("flags", [dict(bf16=True), dict(bf16=False), dict(bf16=False, fp16=True)])
def test_explicit_flags_are_kept_on_cuda(flags, tmp_path, unpatched):
    cfg = _grpo_config(tmp_path, **flags)
    assert (cfg.bf16, bool(cfg.fp16)) == (flags["bf16"], flags.get("fp16", False))
    assert not config_state(cfg).auto_precision


def test_both_flags_raise_on_cuda(tmp_path, unpatched):
    with pytest.raises(ValueError, match="both set"):
        _grpo_config(tmp_path, bf16=True, fp16=True)


@pytest.mark.parametrize(
    "weights, expected",
    [(torch.float16, (False, True)), (torch.bfloat16, (True, False)), (torch.float32, (True, False))],
)
def test_automatic_precision_follows_the_weights_on_cuda(weights, expected):
    args = types.SimpleNamespace(
        bf16=False, fp16=False, use_cpu=False, mixed_precision="no", _slimrl=ConfigState(auto_precision=True)
    )
    precision.resolve_trainer_precision(args, tiny_llama(dtype=weights))
    assert (args.bf16, args.fp16) == expected
    assert args.mixed_precision == ("bf16" if expected[0] else "fp16")


def test_automatic_precision_with_use_cpu_is_no_autocast():
    args = types.SimpleNamespace(
        bf16=True, fp16=False, use_cpu=True, mixed_precision="bf16", _slimrl=ConfigState(auto_precision=True)
    )
    precision.resolve_trainer_precision(args, tiny_llama(dtype=torch.float32))
    assert (args.bf16, args.fp16, args.mixed_precision) == (False, False, "no")


@pytest.mark.parametrize(
    "flags, weights, message",
    [
        (dict(bf16=False, fp16=True), torch.bfloat16, "fp16=True but the model's weights are bfloat16"),
        (dict(bf16=True, fp16=False), torch.float16, "bf16=True but the model's weights are float16"),
    ],
)
def test_explicit_flag_contradicting_the_weights_raises_on_cuda(flags, weights, message):
    args = types.SimpleNamespace(use_cpu=False, **flags, _slimrl=ConfigState(auto_precision=False))
    with pytest.raises(ValueError, match=message):
        precision.resolve_trainer_precision(args, tiny_llama(dtype=weights))


@pytest.mark.parametrize("flags, mixed", [(dict(bf16=None), "bf16"), (dict(bf16=False, fp16=True), "fp16")])
def test_patched_trainer_steps_in_the_resolved_precision(flags, mixed, tmp_path, unpatched):
    """A bare config (bf16 unset: TRL's default bf16 kept) and fp16 on fp32 weights (GradScaler) both train."""
    with patched_state("grpo"):
        trainer = grpo_trainer(str(tmp_path), **dict(cuda_config("fp32"), **flags))
        loss = grpo_step(trainer)
    assert trainer.accelerator.mixed_precision == mixed
    assert next(trainer.model.parameters()).is_cuda
    grads = [p.grad for p in trainable(trainer.model).values()]
    assert torch.isfinite(torch.tensor(loss)) and grads and all(g is not None for g in grads)


def test_from_pretrained_picks_bf16_on_a_bf16_gpu(tiny_model_dir):
    model, _ = FastLanguageModel.from_pretrained(tiny_model_dir, max_seq_length=64)
    assert model.dtype == torch.bfloat16 and model.device.type == "cuda"
    model32, _ = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32", max_seq_length=64)
    assert model32.dtype == torch.float32 and model32.device.type == "cuda"
