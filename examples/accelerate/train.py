"""A patched TRL script for several processes: GRPO, RLOO, DPO, KTO or ORPO with LoRA, under accelerate or torchrun.

    accelerate launch --config_file examples/accelerate/ddp.yaml examples/accelerate/train.py --algorithm grpo
    torchrun --nproc_per_node 2 examples/accelerate/train.py --algorithm dpo,kto     (CPU: 2 processes over gloo)

It is an ordinary TRL script plus the two slimrl lines; nothing in it is specific to a launcher: accelerate, through
TRL, wraps the model (DDP, FSDP2, DeepSpeed) and shards the batches. `--model` takes a Hub id or a folder; the
default is a tiny random Llama built in place, so a launch can be checked on any machine without a download.
`--algorithm a,b,...` runs several one after the other in the same processes. Rank 0 prints one JSON line per run:
world size, logged losses, and whether every rank ended with the same LoRA weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

import torch

PROMPTS = ["what is 3 plus 4 ?", "solve 8 times 9 step by step", "hello world", "write the sum of 12 and 7"]
GOOD = [" 7", " 72", " hello", " 19 ."]
BAD = [" 8 or 9", " no", " good bye", " 71 71"]


def tiny_model_folder() -> str:
    """A tiny random Llama saved by this process before any trainer exists (once the launch's process group is up,
    transformers' save_pretrained writes the weights from the main process only)."""
    from slimrl.testing import save_tiny_model

    return save_tiny_model(tempfile.mkdtemp(prefix="slimrl-tiny-"), vocab_size=512, seed=0, hidden_size=64)


def load(model_name: str, max_seq_length: int = 256):
    from slimrl import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(model_name, max_seq_length=max_seq_length)
    model = FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, use_gradient_checkpointing=False, random_state=0
    )
    return model, tokenizer


def dataset(algorithm: str, rows: int = 16):
    from datasets import Dataset

    index = range(rows)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in index]
    if algorithm in ("grpo", "rloo"):
        return Dataset.from_dict({"prompt": prompts})
    good, bad = [GOOD[i % len(GOOD)] for i in index], [BAD[i % len(BAD)] for i in index]
    if algorithm == "kto":
        labels = [i % 2 == 0 for i in index]
        return Dataset.from_dict(
            {
                "prompt": prompts,
                "label": labels,
                "completion": [g if lab else b for g, b, lab in zip(good, bad, labels)],
            }
        )
    return Dataset.from_dict({"prompt": prompts, "chosen": good, "rejected": bad})


def length_reward(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def trainer_for(algorithm: str, model, tokenizer, cli):
    import trl

    common = dict(
        output_dir=f"{cli.output_dir}/{algorithm}",
        max_steps=cli.max_steps,
        learning_rate=cli.learning_rate,
        per_device_train_batch_size=cli.per_device_train_batch_size,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        gradient_checkpointing=False,
    )
    data = dataset(algorithm)
    if algorithm in ("grpo", "rloo"):
        config_cls, trainer_cls = {
            "grpo": (trl.GRPOConfig, trl.GRPOTrainer),
            "rloo": (trl.RLOOConfig, trl.RLOOTrainer),
        }[algorithm]
        args = config_cls(**common, num_generations=cli.num_generations, max_completion_length=16)
        return trainer_cls(
            model=model, reward_funcs=length_reward, args=args, train_dataset=data, processing_class=tokenizer
        )
    name = algorithm.upper()  # trl.ORPOConfig exists once PatchFastRL("orpo") aliased TRL's experimental ORPO
    config_cls, trainer_cls = getattr(trl, f"{name}Config"), getattr(trl, f"{name}Trainer")
    args = config_cls(**common, max_length=64)
    return trainer_cls(model=model, args=args, train_dataset=data, processing_class=tokenizer)


def ranks_in_sync(model) -> bool:
    """Every process holds the same trainable weights (DDP / ZeRO keep them in step)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return True
    params = [p for p in model.parameters() if p.requires_grad]
    gather = contextlib.nullcontext()
    if any(hasattr(p, "ds_id") for p in params):  # ZeRO-3: each rank holds a slice; compare the whole weights
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(params)
    with torch.no_grad(), gather:  # FSDP2: DTensor shards, compared whole
        local = torch.stack(
            [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().sum() for p in params]
        )
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithm", default="grpo", help="grpo, rloo, dpo, kto, orpo, or several: grpo,dpo")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--output_dir", default="outputs/accelerate-example")
    parser.add_argument("--max_steps", type=int, default=2)
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    cli = parser.parse_args(argv)
    model_name = tiny_model_folder() if cli.model == "tiny" else cli.model
    for algorithm in cli.algorithm.split(","):
        accelerator = train_one(algorithm, model_name, cli)
    end_processes(accelerator)


def train_one(algorithm: str, model_name: str, cli):
    """Patch, load, train one algorithm and print its result from rank 0; returns the trainer's accelerator (the
    trainer and its wrapped model are freed when this returns, while the process group is still up)."""
    from slimrl import FastLanguageModel, PatchFastRL, unpatch

    PatchFastRL(algorithm, FastLanguageModel)
    model, tokenizer = load(model_name)
    trainer = trainer_for(algorithm, model, tokenizer, cli)
    trainer.train()
    in_sync = ranks_in_sync(trainer.model)
    if trainer.accelerator.is_main_process:
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(
            json.dumps(
                {
                    "algorithm": algorithm,
                    "world_size": trainer.args.world_size,
                    "distributed_type": str(trainer.accelerator.distributed_type),
                    "losses": losses,
                    "ranks_in_sync": in_sync,
                }
            ),
            flush=True,
        )
    unpatch()
    return trainer.accelerator


def end_processes(accelerator) -> None:
    """Free the models, then destroy the process group: in that order.

    DDP's reducer holds the group too. Once the group is destroyed, the reducer may be its last owner, and freeing
    the reducer then destroys the group while holding Python's lock (torch frees a reducer with the lock held): the
    group waits for its worker thread, which may still need that lock to release the tensors of the last collective,
    and the rank hangs (2 of 10 launches of this script with all five algorithms, before this order). Freed first, the
    reducer leaves the group's last reference to destroy_process_group, and torch frees a group object without the
    lock.
    """
    accelerator.free_memory()  # drops the accelerator's references to the wrapped model, optimizer and data
    accelerator.end_training()  # destroys the process group


def leave_without_interpreter_teardown() -> None:
    """Exit at once, once every run has finished and printed.

    Destroying the process group does not stop the gloo groups other objects still hold: DeepSpeed keeps its engines
    (and each ZeRO-3 parameter its group) in module globals, so their C++ worker threads are still running while
    Python shuts down. One of them touching Python then (releasing a tensor, running a callback) is stopped by the
    interpreter in a way that aborts the rank ("terminate called without an active exception", exit -6) after its
    work is done, and the launcher reports the whole run as failed. Leaving with os._exit skips that teardown.
    Only the success path gets here: an exception in main() still exits with its traceback and code 1.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave_without_interpreter_teardown()
