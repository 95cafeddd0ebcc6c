"""One rank of a 2-process colocate run (tests/generation/test_vllm_colocate_ddp.py): each rank builds its own vLLM
engine (FastLanguageModel fast_inference=True) and the patched GRPO trainer rolls out on it.

    torchrun --nproc_per_node 2 tests/generation/_colocate_worker.py OUT MODEL_DIR [STALE_RANK]

STALE_RANK (the negative control): that rank's engine gets the adapter only at its first sync, so its later rollouts
come from stale weights. Rank 0 writes the world size, the generation class, TRL's sampling gaps (gathered over the
ranks by TRL) and every rank's number of hand-overs.
"""

from __future__ import annotations

import json
import sys

from _launch import end_process_group, leave_without_interpreter_teardown


def train(out: str, model_dir: str, stale_rank: int = -1) -> None:
    import torch
    import torch.distributed as dist
    import trl
    from datasets import Dataset

    from slimrl import FastLanguageModel, PatchFastRL

    torch.set_num_threads(1)
    PatchFastRL("grpo", FastLanguageModel)
    base, tokenizer = FastLanguageModel.from_pretrained(
        model_dir,
        max_seq_length=256,
        dtype="float32",
        fast_inference=True,
        gpu_memory_utilization=0.05,
        vllm_engine_kwargs={"enforce_eager": True},
    )
    engine, rank = base.vllm_engine, dist.get_rank()
    if rank == stale_rank:
        sync = engine.sync
        engine.sync = lambda m, use_adapter=None: None if engine.sync_count else sync(m, use_adapter)
    model = FastLanguageModel.get_peft_model(base, r=8, lora_alpha=16, random_state=1)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"what is {i} plus {i}"}] for i in range(16)]})

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"]) % 7) for c in completions]

    args = trl.GRPOConfig(
        output_dir=f"{out}.run",
        per_device_train_batch_size=2,
        num_generations=4,
        max_completion_length=16,
        max_steps=3,
        learning_rate=1e-2 if stale_rank < 0 else 5e-2,
        logging_steps=1,
        report_to=[],
        bf16=False,
        save_strategy="no",
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    syncs = [None] * dist.get_world_size()
    dist.all_gather_object(syncs, engine.sync_count)
    if rank == 0:
        gaps = [h["sampling/sampling_logp_difference/max"] for h in trainer.state.log_history if "loss" in h]
        with open(out, "w") as f:
            json.dump(
                {
                    "world_size": trainer.args.world_size,
                    "generation": type(trainer.vllm_generation).__name__,
                    "gaps": gaps,
                    "syncs": syncs,
                },
                f,
            )


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], *(int(x) for x in sys.argv[3:4]))
    end_process_group()  # the trainer is gone with train()'s frame
    leave_without_interpreter_teardown()
