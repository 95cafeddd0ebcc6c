"""Interruption and resume fidelity: a real SIGINT/SIGTERM sent to a child process in the
middle of a tiny GRPO, RLOO, DPO or PPO training; the resumed run repeats the uninterrupted one.

Every run is a forked child with one torch thread, so all three runs (straight, interrupted, resumed) execute the
same float operations in the same order on the same kernels: the tolerance is zero (bitwise-equal losses and
adapter weights). A resume that skipped any state (RNG, optimizer, scheduler, data order, the rollout buffer) would
change the samples or the update and show up as a difference. GRPO runs with steps_per_generation=2 and
num_iterations=2 (one generation serves 4 optimizer steps), interrupted after step 3 of 6: the resume starts in the
middle of a rollout buffer and regenerates at step 5 (RLOO the same). DPO runs with gradient accumulation 2 and a
shuffled sampler. slimrl's PPO (slow tier) runs one rollout per 2 optimizer steps, so step 3 is mid-rollout (its
own checkpoint file holds the rollout). Negative controls: the same comparison fails on a 0.1% change of one adapter
weight, and a resume whose checkpoint lost the rollout buffer (stock TRL's behaviour) does not repeat the run.
"""

import json
import multiprocessing
import os
import shutil
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from slimrl.training.checkpoints import BUFFER_FILE, latest_checkpoint

import _resume_child as R

FORK = multiprocessing.get_context("fork")
MAX_STEPS, HALF = 6, 3


@pytest.fixture(scope="module", autouse=True)
def _imported_before_fork():
    """TRL, peft and datasets imported once here: each forked child starts with them (seconds saved per child)."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import trl  # noqa: F401
    from trl import DPOTrainer, GRPOTrainer, RLOOTrainer  # noqa: F401

    import slimrl.ppo  # noqa: F401


def _start(kind, root, name, max_steps=MAX_STEPS, **kwargs):
    results = root / f"{name}-results"
    results.mkdir()
    proc = FORK.Process(target=R.train_child, args=(kind, str(root / name), str(results), max_steps), kwargs=kwargs)
    proc.start()
    return proc, results


def _finish(proc, timeout=300) -> int:
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        pytest.fail("child training did not finish")
    return proc.exitcode


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if not proc.is_alive() or time.monotonic() > deadline:
            pytest.fail(f"the child never reached the paused step (exit code {proc.exitcode})")
        time.sleep(0.02)


def _results(folder):
    losses = [tuple(x) for x in json.loads((folder / "losses.json").read_text())]
    return losses, load_file(str(folder / "adapter.safetensors"))


def assert_same_run(a, b) -> None:
    (losses_a, weights_a), (losses_b, weights_b) = a, b
    assert losses_a == losses_b, f"logged losses differ:\n{losses_a}\n{losses_b}"
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), f"adapter weight {name} differs"


def _interrupt(kind, root, signum, pause_at=HALF):
    marker = root / "paused"
    proc, _ = _start(kind, root, "stopped", pause_at=pause_at, marker=str(marker))
    _wait_for(marker, proc)
    os.kill(proc.pid, signum)
    return _finish(proc)


@pytest.mark.parametrize(
    "kind, signum",
    [
        ("grpo", signal.SIGINT),
        ("dpo", signal.SIGTERM),
        ("rloo", signal.SIGTERM),
        pytest.param("ppo", signal.SIGINT, marks=pytest.mark.slow),
    ],
)
def test_interrupted_run_resumes_to_the_uninterrupted_result(kind, signum, tmp_path, capfd):
    straight, straight_results = _start(kind, tmp_path, "straight")
    assert _finish(straight) == 0
    assert _interrupt(kind, tmp_path, signum) == 128 + signum  # 130 for SIGINT, 143 for SIGTERM
    checkpoint = latest_checkpoint(str(tmp_path / "stopped"))
    assert checkpoint is not None and checkpoint.endswith(f"checkpoint-{HALF}")
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert os.path.isfile(os.path.join(checkpoint, name)), name
    assert os.path.isfile(os.path.join(checkpoint, BUFFER_FILE)) == (kind in ("grpo", "rloo"))
    err = capfd.readouterr().err
    name = signal.Signals(signum).name
    assert f"stopped by {name} after step {HALF}/{MAX_STEPS}; checkpoint {checkpoint}." in err
    assert f'Resume: trainer.train(resume_from_checkpoint="{checkpoint}")' in err

    resumed, resumed_results = _start(kind, tmp_path, "resumed", resume=checkpoint)
    assert _finish(resumed) == 0
    reference = _results(straight_results)
    assert [step for step, _ in reference[0]] == list(range(1, MAX_STEPS + 1))
    assert_same_run(reference, _results(resumed_results))

    if kind == "grpo":  # negative control: without the rollout buffer the resumed run trains on other rollouts
        bare = tmp_path / "bare-checkpoint"
        shutil.copytree(checkpoint, bare)
        os.remove(bare / BUFFER_FILE)
        again, again_results = _start(kind, tmp_path, "resumed-bare", resume=str(bare))
        assert _finish(again) == 0
        with pytest.raises(AssertionError):
            assert_same_run(reference, _results(again_results))


def test_comparison_catches_a_small_weight_change(tmp_path):
    losses = [(1, 0.5), (2, 0.25)]
    weights = {"a": torch.linspace(-1, 1, 64), "b": torch.ones(3, 3)}
    perturbed = {"a": weights["a"].clone(), "b": weights["b"].clone()}
    perturbed["b"][1, 1] *= 1.001
    assert_same_run((losses, weights), (losses, {k: v.clone() for k, v in weights.items()}))
    with pytest.raises(AssertionError):
        assert_same_run((losses, weights), (losses, perturbed))
    with pytest.raises(AssertionError):
        assert_same_run((losses, weights), ([(1, 0.5), (2, 0.25 * 1.001)], weights))


def test_second_signal_exits_at_once_without_a_checkpoint(tmp_path, capfd):
    marker = tmp_path / "paused"
    proc, _ = _start("dpo", tmp_path, "run", max_steps=4, pause_at=2, marker=str(marker), pause_forever=True)
    _wait_for(marker, proc)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    assert _finish(proc, timeout=30) == 130
    assert time.monotonic() - started < 20  # the paused step would hold it for a minute
    assert latest_checkpoint(str(tmp_path / "run")) is None
    err = capfd.readouterr().err
    assert "SIGINT: finishing step 2, then saving a checkpoint" in err
    assert "second SIGINT: exiting now, without a checkpoint" in err


def _agree(rank, flag, port, results):
    import torch.distributed as dist

    from slimrl.training.interrupt import any_rank

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results.put((rank, any_rank(flag)))
    dist.destroy_process_group()


@pytest.mark.parametrize("flags", [(True, False), (False, False)])
def test_all_processes_stop_after_the_same_step(flags):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = FORK.Queue()
    procs = [FORK.Process(target=_agree, args=(rank, flag, port, results)) for rank, flag in enumerate(flags)]
    for proc in procs:
        proc.start()
    for proc in procs:
        assert _finish(proc, timeout=60) == 0
    answers = dict(results.get(timeout=5) for _ in procs)
    assert answers == {0: any(flags), 1: any(flags)}


@pytest.mark.parametrize("previous", ["python's default", "the user's handler"])
def test_a_signal_after_train_died_is_delivered_as_before(previous):
    """The handler in place before SafeInterrupt gets the signal back (set here: a shell's `&` starts a process with
    SIGINT ignored, so whatever the test process inherited is not a fixed starting point)."""
    from slimrl import SafeInterrupt

    calls = []
    before = (
        signal.default_int_handler if previous == "python's default" else (lambda signum, frame: calls.append(signum))
    )
    inherited = signal.signal(signal.SIGINT, before)
    try:
        interrupt = SafeInterrupt()
        interrupt.install()  # what on_train_begin does; train() then "dies" without on_train_end
        assert signal.getsignal(signal.SIGINT) == interrupt._handle
        if before is signal.default_int_handler:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs between bytecodes
        else:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is before and interrupt.signum is None
    finally:
        signal.signal(signal.SIGINT, inherited)
