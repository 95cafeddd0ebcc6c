"""The rollout buffer file of GRPO/RLOO checkpoints (slimrl.training.checkpoints): saved per process, read back
without pickle, dropped with a warning when the run's buffer geometry changed."""

from types import SimpleNamespace

import pytest
import torch

from slimrl.training.checkpoints import BUFFER_FILE, load_rollout_buffer, run_dir_of, save_rollout_buffer


def _trainer(spg=2, iterations=2, step=3, buffer=None, world=1, rank=0):
    args = SimpleNamespace(steps_per_generation=spg, world_size=world, process_index=rank)
    return SimpleNamespace(
        args=args,
        num_iterations=iterations,
        _step=step,
        _buffered_inputs=buffer,
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )


def test_buffer_round_trip_and_per_process_files(tmp_path):
    buffer = [
        {
            "prompt_ids": torch.arange(6).view(2, 3),
            "advantages": torch.tensor([0.5, -0.5]),
            "num_items_in_batch": torch.tensor(4),
            "image_sizes": [(1, 2), (3, 4)],
        }
    ] * 2
    save_rollout_buffer(_trainer(buffer=buffer), str(tmp_path))
    restored = _trainer(step=0)
    assert load_rollout_buffer(restored, str(tmp_path)) and restored._step == 3
    assert torch.equal(restored._buffered_inputs[1]["prompt_ids"], buffer[1]["prompt_ids"])
    assert restored._buffered_inputs[0]["image_sizes"] == [(1, 2), (3, 4)]
    save_rollout_buffer(_trainer(buffer=buffer, world=2, rank=1), str(tmp_path))
    assert (tmp_path / BUFFER_FILE.replace(".pt", "_1.pt")).is_file()


def test_nothing_to_save_or_load_is_not_an_error(tmp_path):
    save_rollout_buffer(_trainer(buffer=None), str(tmp_path))
    assert not (tmp_path / BUFFER_FILE).exists()
    untouched = _trainer(step=5)
    assert not load_rollout_buffer(untouched, str(tmp_path)) and untouched._step == 5
    assert not load_rollout_buffer(SimpleNamespace(args=None), str(tmp_path))  # an offline trainer


def test_changed_geometry_drops_the_buffer_with_a_warning(tmp_path):
    save_rollout_buffer(_trainer(buffer=[{"x": torch.ones(1)}]), str(tmp_path))
    other = _trainer(spg=4, step=0)
    with pytest.warns(UserWarning, match=r"\(steps_per_generation, num_iterations\)=\(2, 2\); this run has \(4, 2\)"):
        assert not load_rollout_buffer(other, str(tmp_path))
    assert other._step == 0 and other._buffered_inputs is None


def test_run_dir_of():
    assert run_dir_of("out/run/checkpoint-12") == "out/run" and run_dir_of("out/run/") == "out/run"
