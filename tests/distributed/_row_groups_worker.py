"""One process of tests/distributed/test_row_groups_ddp.py: patched GRPO under DDP with "auto" row groups of a tiny
token budget, so ranks whose rows differ in length plan different numbers of groups before agreeing.

    torchrun --nproc_per_node 2 tests/distributed/_row_groups_worker.py OUT [--no-agreement]
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from slimrl import PatchFastRL
from slimrl.models import long_context
from slimrl.ops import row_groups as rg
from slimrl.patches.scoring.row_groups import row_group_stats

import _rl_parity as R
import _tiny as T
from _launch import end_process_group, leave_without_interpreter_teardown

AUTO_GROUP_TOKENS = 30  # a couple of the tiny rows per group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--no-agreement", action="store_true", help="negative control: each rank its own count")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    record = train(cli)
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, record)
    if dist.get_rank() == 0:
        with open(cli.out, "w") as f:
            json.dump(per_rank, f)
    dist.barrier()
    end_process_group()  # the trainer is gone with train()'s frame


def train(cli) -> dict:
    """Patched GRPO on 2 ranks with row groups; this rank's record of the groups it planned and ran."""
    rg.AUTO_GROUP_TOKENS = AUTO_GROUP_TOKENS
    long_context.CPU_MIN_FORWARD_TOKENS = 1  # "auto" groups these tiny rows on a CPU too
    planned = []
    real_split = rg.split_to
    rg.split_to = lambda groups, count: planned.append((len(groups), count)) or real_split(groups, count)
    if cli.no_agreement:
        rg.agreed_count = lambda count, device: count
    PatchFastRL("grpo")
    config = dict(
        num_generations=4,
        max_completion_length=9,
        beta=0.04,
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_iterations=2,
        optim="sgd",
        learning_rate=0.1,
    )
    args = R.make_config("grpo", os.path.dirname(cli.out), **config)
    trainer = R.build_trainer("grpo", T.tiny_model(0), args, T.lora_config(), train_dataset=R.dataset(12))
    trainer.train()
    weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters() if p.requires_grad])
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    stats = row_group_stats(trainer)
    return dict(
        world_size=trainer.args.world_size,
        grouped_steps=stats.grouped_steps,
        grouped_passes=stats.grouped_passes,
        planned=planned,
        equal_weights=all(torch.equal(gathered[0], w) for w in gathered),
    )


if __name__ == "__main__":
    main()
    leave_without_interpreter_teardown()
