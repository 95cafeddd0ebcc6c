"""The memory readings behind `peak_memory_gb` belong to the user: slimrl reads the process's high-water mark (VmHWM
on CPU, `torch.cuda.max_memory_allocated` on CUDA: tests/gpu/test_gpu_memory.py) and never resets it, so a user's
own whole-run reading is the same with slimrl's trainers as without them.

The user's reading here: VmHWM, started by the test (a write of "5" to /proc/self/clear_refs, as a user would), with
a 1 GiB peak made before training that the tiny DPO run never reaches again. Negative control: a reset at every
step's start (what the metric used to do) loses that peak from the user's reading, and the check says so.
"""

import pytest
import torch
from transformers import TrainerCallback

from slimrl.memory import StepPeak, peak_memory_bytes

import _resume_child as R

GiB = 1024**3
SPIKE = GiB
CLEAR_REFS = "/proc/self/clear_refs"


def _can_reset() -> bool:
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _can_reset(), reason="needs Linux's /proc/self/clear_refs (VmHWM reset)")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ResetEveryStep(TrainerCallback):
    """The per-step reset slimrl's metric used to make (negative control)."""

    def on_step_begin(self, args, state, control, **kwargs):
        _can_reset()


def _train_after_a_spike(out, callbacks=(), budget_gb=None):
    """(the user's reading right after the spike, their reading after training, the trainer)."""
    trainer = R.build_trainer("dpo", str(out), 2, list(callbacks))
    trainer.args.slimrl_max_memory_gb = budget_gb
    _can_reset()  # the user starts their own reading
    spike = torch.ones(SPIKE // 4)  # 1 GiB of touched pages, freed at once
    del spike
    high = peak_memory_bytes("cpu")
    trainer.train()
    return high, peak_memory_bytes("cpu"), trainer


def test_users_whole_run_peak_reading_is_unchanged_by_training(tmp_path):
    high, after, trainer = _train_after_a_spike(tmp_path / "run")
    assert after >= high  # the peak before training is still in the user's reading
    logged = [h["peak_memory_gb"] for h in trainer.state.log_history if "peak_memory_gb" in h]
    assert len(logged) == 2 and all(value >= high / GiB - 1e-4 for value in logged)  # the same reading


def test_a_reset_at_every_step_would_lose_the_users_peak(tmp_path):
    high, after, _ = _train_after_a_spike(tmp_path / "run", [ResetEveryStep()])
    assert after < high - SPIKE // 2  # the check above would fail: it can tell


def test_a_peak_made_before_training_stops_nothing_under_a_budget(tmp_path):
    budget = (peak_memory_bytes("cpu") + SPIKE // 2) / GiB  # below the spike, above the tiny run's memory
    high, _, trainer = _train_after_a_spike(tmp_path / "run", budget_gb=budget)
    assert high > budget * GiB and trainer.state.global_step == 2


def test_step_peak_is_exact_where_the_mark_rose_and_a_lower_bound_elsewhere():
    assert StepPeak(before=10, after=25, in_use_before=5, in_use_after=7).known_bytes == 25
    assert StepPeak(before=30, after=30, in_use_before=12, in_use_after=9).known_bytes == 12
