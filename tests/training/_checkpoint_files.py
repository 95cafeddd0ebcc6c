"""A checkpoint folder with the files the HF Trainer writes (trainer state, adapter safetensors, optimizer,
scheduler and RNG states as torch zip files), small and real enough for the checks that read them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_checkpoint(path: Path, step: int = 2) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    save_file({"lora_A": torch.randn(4, 8), "lora_B": torch.zeros(8, 4)}, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    torch.save({"state": {}, "param_groups": [{"lr": 1e-4}]}, path / "optimizer.pt")
    torch.save({"last_epoch": step}, path / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.get_rng_state()}, path / "rng_state.pth")
    return path


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `folder` with its modification time and bytes (to show nothing was written)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
