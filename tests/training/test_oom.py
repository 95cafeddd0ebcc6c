"""Out of memory during a step: caught once, the message gives the measured/planned peak and the
settings that would fit, and the last completed step's checkpoint is kept (and resumes to the uninterrupted run).

Failures are injected from inside the step: a forward pre-hook on a decoder block raises `torch.OutOfMemoryError`
(what CUDA raises; simulated here), or makes a real CPU allocation of 2^50 bytes (PyTorch's "can't allocate memory"
RuntimeError), or the budget `slimrl_max_memory_gb` is lowered below the measured peak after step 1. In-process
runs use one torch thread and the same seed, so the resumed run is compared bitwise with a straight one.
"""

import os

import pytest
import torch
from safetensors.torch import load_file

from slimrl.training.checkpoints import BUFFER_FILE, is_complete
from slimrl.training.oom import TrainingOutOfMemory

import _resume_child as R


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FailInStep:
    """From the step that becomes step `at`, the first decoder block's forward runs `fail()`."""

    def __init__(self, at, fail):
        from transformers import TrainerCallback

        self.at, self.fail, self.armed = at, fail, False
        self.callback = type("Fail", (TrainerCallback,), {"on_step_begin": self.on_step_begin})()

    def on_step_begin(self, args, state, control, **kwargs):
        self.armed = state.global_step + 1 >= self.at

    def hook(self, module, inputs):
        if self.armed:
            self.fail()


def _trainer_failing_at(kind, out, at, fail, max_steps=4):
    failing = FailInStep(at, fail)
    trainer = R.build_trainer(kind, str(out), max_steps, [failing.callback])
    block = trainer.model.get_base_model().model.layers[0]
    block.register_forward_pre_hook(failing.hook)
    return trainer


def _cuda_oom():
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.20 GiB is free."
    )


def _adapter(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def _losses(trainer):
    return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("kind", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])
def test_simulated_cuda_oom_keeps_the_last_step_and_resumes_exactly(kind, tmp_path):
    from slimrl.ppo.checkpoint import PPO_STATE

    straight = R.build_trainer(kind, str(tmp_path / "straight"), 4)
    straight.train()
    trainer = _trainer_failing_at(kind, tmp_path / "run", 3, _cuda_oom)  # GRPO: mid-buffer; PPO: a new rollout
    with pytest.raises(TrainingOutOfMemory) as caught:
        trainer.train()
    message = str(caught.value)
    assert isinstance(caught.value, torch.OutOfMemoryError)  # `except torch.OutOfMemoryError` still matches
    assert "Training step 3 of 4 stopped, out of memory: CUDA out of memory. Tried to allocate 20.00 GiB" in message
    assert "Memory high-water mark when the last completed step ended:" in message
    assert "Planned peak of this step:" in message or kind == "ppo"  # slimrl plan has no PPO model yet
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert f"checkpoint is kept: {checkpoint}" in message
    assert is_complete(str(checkpoint)) and (checkpoint / (BUFFER_FILE if kind == "grpo" else PPO_STATE)).is_file()
    assert not (tmp_path / "run" / "checkpoint-3").exists()

    resumed = R.build_trainer(kind, str(tmp_path / "run"), 4)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert _losses(resumed) == _losses(straight)
    for name, weight in _adapter(straight).items():
        assert torch.equal(weight, _adapter(resumed)[name]), name
    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    assert saved  # the checkpoint holds the adapter of step 2, not a later one


def test_real_cpu_allocation_failure_is_caught(tmp_path):
    trainer = _trainer_failing_at("dpo", tmp_path / "run", 2, lambda: torch.empty(2**50, dtype=torch.uint8))
    with pytest.raises(TrainingOutOfMemory, match="DefaultCPUAllocator: can't allocate memory") as caught:
        trainer.train()
    assert "checkpoint is kept" in str(caught.value) and is_complete(str(tmp_path / "run" / "checkpoint-1"))


def test_memory_budget_stops_with_the_measured_peak(tmp_path):
    from transformers import TrainerCallback

    class TightenAfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            args.slimrl_max_memory_gb = 0.01

    trainer = R.build_trainer("dpo", str(tmp_path / "run"), 4, [TightenAfterStep1()])
    with pytest.raises(TrainingOutOfMemory, match=r"measured peak \d+\.\d\d GiB is over slimrl_max_memory_gb=0.01"):
        trainer.train()
    assert trainer.state.global_step == 1 and is_complete(str(tmp_path / "run" / "checkpoint-1"))


def test_first_step_failure_has_no_checkpoint_and_other_errors_pass_through(tmp_path):
    def boom():
        raise RuntimeError("boom inside the model")

    trainer = _trainer_failing_at("dpo", tmp_path / "a", 1, _cuda_oom, max_steps=2)
    with pytest.raises(TrainingOutOfMemory, match="No step had completed: there is no checkpoint"):
        trainer.train()
    trainer = _trainer_failing_at("dpo", tmp_path / "b", 1, boom, max_steps=2)
    with pytest.raises(RuntimeError, match="boom inside the model") as caught:
        trainer.train()
    assert not isinstance(caught.value, TrainingOutOfMemory)
    assert not os.path.exists(tmp_path / "b" / "checkpoint-1")


def test_budget_is_validated_when_the_config_is_built(tmp_path):
    from slimrl import PatchFastRL

    PatchFastRL("dpo")
    from trl import DPOConfig

    with pytest.raises(ValueError, match="slimrl_max_memory_gb must be a positive number"):
        DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, slimrl_max_memory_gb=-1)
    config = DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, slimrl_max_memory_gb=8)
    assert config.slimrl_max_memory_gb == 8.0
