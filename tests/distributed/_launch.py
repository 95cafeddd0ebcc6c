"""Starting N CPU processes the way a user does: `torchrun --standalone --nproc_per_node N script ...` (gloo).

Each process gets OMP_NUM_THREADS=1 (two torch processes spinning OpenMP threads on two cores slow each other down
~20x), the repository's src/ and test helper folders on PYTHONPATH (pytest's `pythonpath` does not reach a
subprocess), and no hub access. `accelerate launch --cpu --num_processes 2` would start ONE process without a
MULTI_CPU config and mpirun; `accelerate launch --multi_gpu --num_processes 2` starts two through the same torchrun
(docs/scaling.md).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPER_DIRS = ("src", "tests/patches", "tests/models", "tests/distributed", "tests/generation")
TIMEOUT_S = 600


def process_env(**extra: str) -> dict:
    paths = [str(ROOT / d) for d in HELPER_DIRS]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU"):
        env.pop(name, None)  # a launch inside a launch would inherit the outer one's rendezvous
    env.update(extra)
    return env


def end_process_group() -> None:
    """A worker's end, called once no trainer is referenced any more: free what is left of the trainers, then destroy
    the group, in that order (examples/accelerate/train.py's end_processes says why: a DDP reducer freed after the
    group was destroyed can hang the rank)."""
    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()


@functools.cache
def _example_module():
    spec = importlib.util.spec_from_file_location("accelerate_example", ROOT / "examples/accelerate/train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def example_function(name: str):
    """A function of examples/accelerate/train.py, loaded from that file (its one owner: users copy it alone)."""
    return getattr(_example_module(), name)


def leave_without_interpreter_teardown() -> None:
    """A worker's last call, once its results are written and its process group destroyed: the exit that
    examples/accelerate/train.py ends with (its docstring says why)."""
    example_function("leave_without_interpreter_teardown")()


def torchrun(script: str | Path, *args: str, nproc: int = 2, check: bool = True, **env: str):
    """Run `script` in `nproc` processes; returns the CompletedProcess (stdout and stderr together)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *map(str, args),
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=process_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-6000:]}")
    return done


def accelerate_launch(config: str | Path, script: str | Path, *args: str, check: bool = True):
    """`accelerate launch --config_file config script ...` (its own launcher logic, torchrun underneath)."""
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        str(script),
        *map(str, args),
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-6000:]}")
    return done
