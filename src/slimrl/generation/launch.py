"""One vLLM engine per rank when a trainer script is launched as several processes (torchrun, accelerate launch).

1. The problem it solves: slimrl's engine is in-process with vLLM's "uni" executor, which initialises
   torch.distributed itself as a world of one when no process group exists yet. `FastLanguageModel.from_pretrained`
   (fast_inference=True) runs before the trainer, so every rank ended in its own world of one: transformers then
   counted a world size of 1 and each rank trained alone (or TRL refused the batch geometry).
2. So, when the launcher's environment says WORLD_SIZE > 1, the launch's process group is joined first (env://, the
   backend accelerate would pick: NCCL on CUDA on this rank's GPU, gloo on CPU; accelerate and the trainer then use
   that group) and the engine is built with vLLM's "external_launcher" executor, TRL's own choice for colocate mode:
   vLLM uses the existing world and gives each rank a tensor-parallel group of one, i.e. one engine per rank, each
   fed by its own rank's model (each rank syncs its own adapter before its own rollouts).
3. Each rank's engine samples with `seed + rank`, as TRL seeds its colocate engines by process index, so ranks do
   not draw the same random stream.
4. A group slimrl joined is destroyed when the interpreter exits (an `atexit` handler, a no-op once the script's own
   `accelerator.end_training()` or `destroy_process_group()` ran): a gloo group left alive can abort a rank's exit
   after training has finished ("terminate called without an active exception"). A group someone else created is
   left to its owner.
"""

from __future__ import annotations

import atexit
import os

import torch


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_launch(device_type: str) -> None:
    """Join the launcher's process group now (module docstring, point 2); nothing if it is already joined."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    atexit.register(destroy_joined_group, dist.group.WORLD)


def destroy_joined_group(joined) -> None:
    """At exit: destroy the group join_launch created if it is still the default one (docstring, point 4): not if
    the script already ended it, nor a group the script created after that."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.group.WORLD is joined:
        dist.destroy_process_group()


def engine_launch_kwargs(device_type: str, seed: int) -> dict:
    """vLLM engine keywords for this process: {} in a single process; under a launch of N processes, the group
    joined and the external_launcher executor with this rank's seed."""
    if launched_world_size() <= 1:
        return {}
    join_launch(device_type)
    rank = int(os.environ.get("RANK", "0"))
    return {"distributed_executor_backend": "external_launcher", "seed": seed + rank}
