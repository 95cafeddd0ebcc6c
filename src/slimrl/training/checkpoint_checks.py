"""A checkpoint checked before a resume reads it: a damaged or missing file fails naming the file, and nothing in the
checkpoint or the run folder is written (the check only reads; the resume never starts).

What is checked (the files of the HF Trainer's checkpoint, slimrl/training/checkpoints.py):
- `trainer_state.json`: a JSON object (a run killed while writing it, or a hand edit, leaves something else);
- model weights: at least one of the adapter / model safetensors files, or a sharded model's index with every shard
  it lists; every `.safetensors` file's header is read and the data it declares must fit in the file (a truncated
  copy fails here, not as a deserialisation error after the model was touched);
- `optimizer.pt`: present (without it the HF Trainer resumes with a fresh optimizer, silently: a different run);
  it and the other torch files (`scheduler.pt`, `rng_state*.pth`, `scaler.pt`, slimrl's rollout buffer and PPO
  state) must be whole zip archives (torch's format; a truncated file has no central directory).
DeepSpeed and FSDP checkpoints (`global_step*/`, `pytorch_model_fsdp_*`, `optimizer_*` folders) keep weights and
optimizer state in their own layout: only the trainer state and the torch files at the top are checked there.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zipfile

TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")
WEIGHT_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("adapter_model.bin", "pytorch_model.bin")
SHARDED_LAYOUTS = ("global_step*", "pytorch_model_fsdp_*", "optimizer_*")


class DamagedCheckpoint(ValueError):
    """A file of the checkpoint to resume from is missing or unreadable; the message names it."""


def _damaged(path: str, what: str) -> DamagedCheckpoint:
    folder = os.path.dirname(path)
    return DamagedCheckpoint(
        f"Cannot resume from {folder}: {os.path.basename(path)} {what}. Nothing was written. Resume from an earlier "
        f"checkpoint of {os.path.dirname(folder) or '.'} (--resume <that checkpoint-N folder>), or restore the file."
    )


def check_trainer_state(path: str) -> None:
    if not os.path.isfile(path):
        raise _damaged(path, "is missing (the HF Trainer writes it last: this is not a complete checkpoint)")
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(path, f"is not readable JSON ({exc})") from exc
    if not isinstance(state, dict):
        raise _damaged(path, f"holds a JSON {type(state).__name__}, not the trainer's state object")


def check_safetensors(path: str) -> None:
    """The header is whole and the tensor data it declares fits in the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _damaged(path, f"is cut off ({size} bytes: no safetensors header)")
        (header_size,) = struct.unpack("<Q", head)
        if 8 + header_size > size:
            raise _damaged(path, f"is cut off ({size:,} bytes; its header alone needs {8 + header_size:,})")
        try:
            header = json.loads(f.read(header_size))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _damaged(path, f"has a corrupt safetensors header ({exc})") from exc
    ends = [info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"]
    needed = 8 + header_size + max(ends, default=0)
    if size < needed:
        raise _damaged(path, f"is truncated ({size:,} bytes; its header declares {needed:,})")


def check_torch_file(path: str) -> None:
    """A torch.save file (zip format) with its central directory: not truncated."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise _damaged(path, f"is not a whole torch file (truncated or corrupt: {exc})") from exc


def _weights_present(folder: str) -> list[str]:
    """The weight files to check; raises when the folder holds none."""
    index = os.path.join(folder, WEIGHT_INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise _damaged(index, f"is not a readable shard index ({exc})") from exc
        for shard in shards:
            if not os.path.isfile(os.path.join(folder, shard)):
                raise _damaged(os.path.join(folder, shard), f"is missing (listed in {WEIGHT_INDEX})")
        return [os.path.join(folder, shard) for shard in shards]
    found = [os.path.join(folder, name) for name in WEIGHT_FILES if os.path.isfile(os.path.join(folder, name))]
    if not found and not any(os.path.isfile(os.path.join(folder, name)) for name in PICKLE_WEIGHTS):
        raise _damaged(os.path.join(folder, WEIGHT_FILES[0]), f"is missing (and so are {', '.join(WEIGHT_FILES[1:])})")
    return found


def check_checkpoint(folder: str) -> None:
    """Raise DamagedCheckpoint (a ValueError) naming the first missing or unreadable file of checkpoint `folder`."""
    check_trainer_state(os.path.join(folder, TRAINER_STATE))
    sharded = any(glob.glob(os.path.join(folder, pattern)) for pattern in SHARDED_LAYOUTS)
    if not sharded:
        weights = set(_weights_present(folder)) | set(glob.glob(os.path.join(folder, "*.safetensors")))
        for path in sorted(weights):
            check_safetensors(path)
        if not os.path.isfile(os.path.join(folder, OPTIMIZER)):
            raise _damaged(
                os.path.join(folder, OPTIMIZER),
                "is missing (the optimizer's state: resuming without it would train on from a fresh optimizer)",
            )
    for path in sorted(glob.glob(os.path.join(folder, "*.pt")) + glob.glob(os.path.join(folder, "*.pth"))):
        check_torch_file(path)
