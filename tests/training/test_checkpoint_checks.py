"""slimrl.training.checkpoint_checks: a checkpoint with a damaged or missing file fails a resume naming the file,
before anything reads it, and nothing in the run folder is written (CLI `--resume`, the patched trainers' `train`,
slimrl's PPOTrainer)."""

import json
import os

import pytest

from slimrl.training.checkpoint_checks import DamagedCheckpoint, check_checkpoint

from _checkpoint_files import snapshot, write_checkpoint


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])


DAMAGES = {
    "truncated safetensors": (
        lambda c: _truncate(c / "adapter_model.safetensors", -10),
        r"adapter_model\.safetensors is truncated \(\d+ bytes; its header declares \d+\)",
    ),
    "safetensors cut inside its header": (
        lambda c: _truncate(c / "adapter_model.safetensors", 20),
        r"adapter_model\.safetensors is cut off",
    ),
    "corrupt trainer_state.json": (
        lambda c: (c / "trainer_state.json").write_text('{"global_step": 2, "log_hist'),
        r"trainer_state\.json is not readable JSON",
    ),
    "trainer_state.json not an object": (
        lambda c: (c / "trainer_state.json").write_text("[]"),
        r"trainer_state\.json holds a JSON list",
    ),
    "missing optimizer.pt": (lambda c: os.remove(c / "optimizer.pt"), r"optimizer\.pt is missing"),
    "truncated optimizer.pt": (
        lambda c: _truncate(c / "optimizer.pt", -40),
        r"optimizer\.pt is not a whole torch file",
    ),
    "truncated rng_state.pth": (lambda c: _truncate(c / "rng_state.pth", 100), r"rng_state\.pth is not a whole torch"),
    "no weights": (lambda c: os.remove(c / "adapter_model.safetensors"), r"adapter_model\.safetensors is missing"),
}


def test_a_whole_checkpoint_passes(tmp_path):  # the negative control
    check_checkpoint(str(write_checkpoint(tmp_path / "checkpoint-2")))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_names_the_file_and_writes_nothing(tmp_path, damage):
    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoint-2")
    make, message = DAMAGES[damage]
    make(checkpoint)
    before = snapshot(tmp_path)
    with pytest.raises(DamagedCheckpoint, match=message) as err:
        check_checkpoint(str(checkpoint))
    assert str(err.value).startswith(f"Cannot resume from {checkpoint}: ") and "Nothing was written" in str(err.value)
    assert snapshot(tmp_path) == before


def test_a_sharded_model_needs_every_shard_it_lists(tmp_path):
    import torch
    from safetensors.torch import save_file

    checkpoint = write_checkpoint(tmp_path / "checkpoint-2")
    os.remove(checkpoint / "adapter_model.safetensors")
    save_file({"w": torch.zeros(2)}, str(checkpoint / "model-00001-of-00002.safetensors"))
    weight_map = {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(DamagedCheckpoint, match=r"model-00002-of-00002\.safetensors is missing \(listed in"):
        check_checkpoint(str(checkpoint))


def test_cli_resume_names_the_damaged_file_before_anything_loads(tmp_path):
    from slimrl.cli.args import parse_grpo_args

    run = tmp_path / "run"
    write_checkpoint(run / "checkpoint-2")
    os.remove(run / "checkpoint-2" / "optimizer.pt")
    before = snapshot(tmp_path)
    with pytest.raises(DamagedCheckpoint, match=r"checkpoint-2: optimizer\.pt is missing"):
        parse_grpo_args(["--bf16", "False", "--output_dir", str(run), "--resume"])
    assert snapshot(tmp_path) == before


def test_a_patched_trainers_train_checks_before_reading(tmp_path):
    from slimrl import PatchFastRL

    import _rl_parity as R
    import _tiny as T

    PatchFastRL("grpo")
    run = tmp_path / "run"
    trainer = R.trl_classes("grpo")[1](
        model=T.tiny_model(),
        reward_funcs=R.reward_ids,
        args=R.make_config("grpo", str(run)),
        train_dataset=R.dataset(),
        processing_class=T.tokenizer(),
    )
    checkpoint = write_checkpoint(run / "checkpoint-2")
    _truncate(checkpoint / "adapter_model.safetensors", -10)
    before = snapshot(run)
    for resume in (str(checkpoint), True):  # a path, and True: the newest checkpoint in output_dir
        with pytest.raises(DamagedCheckpoint, match=r"adapter_model\.safetensors is truncated"):
            trainer.train(resume_from_checkpoint=resume)
    assert snapshot(run) == before and trainer.state.global_step == 0


def test_slimrls_ppo_checks_the_checkpoint_before_reading_its_state(tmp_path):
    import torch

    from slimrl.ppo.checkpoint import PPO_STATE, VALUE_WEIGHTS, load_ppo_state

    checkpoint = write_checkpoint(tmp_path / "checkpoint-2")
    torch.save({"step": 2, "episode": 8, "rollout": None, "metrics": {}}, checkpoint / PPO_STATE)
    assert load_ppo_state(str(checkpoint), "cpu")[:2] == (2, 8)  # whole: it loads
    (checkpoint / VALUE_WEIGHTS).write_bytes(b"\x10\x00")  # the critic's weights, cut off
    with pytest.raises(DamagedCheckpoint, match=rf"{VALUE_WEIGHTS} is cut off"):
        load_ppo_state(str(checkpoint), "cpu")
