"""One rank of tests/distributed/test_accelerate_examples.py's check of how examples/accelerate/train.py ends: it
trains DPO with the example's own train_one, then ends with the example's end_processes, and rank 0 prints how many
DDP models (each holding a reducer, which holds the process group) were alive when the group was destroyed.

    torchrun --nproc_per_node 2 _reducer_worker.py example   # as the example ends: none may be alive
    torchrun --nproc_per_node 2 _reducer_worker.py held      # a DDP model still referenced (negative control): one
"""

import argparse
import gc
import json
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from _launch import example_function, leave_without_interpreter_teardown


def live_ddp_models() -> int:
    gc.collect()
    return sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())


def main(mode: str) -> None:
    cli = argparse.Namespace(
        output_dir=sys.argv[2], max_steps=1, learning_rate=5e-5, per_device_train_batch_size=2, num_generations=4
    )
    accelerator = example_function("train_one")("dpo", example_function("tiny_model_folder")(), cli)
    held = accelerator.prepare(torch.nn.Linear(4, 4)) if mode == "held" else None  # noqa: F841 (kept alive)
    live_at_end = []
    end_training = accelerator.end_training
    accelerator.end_training = lambda: live_at_end.append(live_ddp_models()) or end_training()
    example_function("end_processes")(accelerator)
    if accelerator.is_main_process:
        print(json.dumps({"live_ddp_models_when_the_group_ends": live_at_end}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
    leave_without_interpreter_teardown()
