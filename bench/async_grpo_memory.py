"""Stock TRL vs slimrl on AsyncGRPOTrainer (trl.experimental.async_grpo): a training step's working memory, peak
memory, seconds per step and each arm's losses, on CPU.

    PYTHONPATH=src python bench/async_grpo_memory.py --vocab 152064 --completion 256 --threads 1 --markdown \
        --json bench/results/committed/async_grpo_memory_cpu.json
    PYTHONPATH=src python bench/async_grpo_memory.py --quick               # smoke run, tiny sizes

Choices:
* Each (completion length, arm) runs in its own process (this script re-invoked with `--child`), one after the other,
  with OMP/MKL threads pinned (`--threads`, default 1). Arms differ only by `PatchFastRL("async_grpo")`: same config,
  seed, samples and model weights, so equal losses show the same computation ran.
* Stock AsyncGRPO runs its packed rows through TRL's FlashAttention-3 kernel, CUDA only. Off CUDA the stock arm
  registers slimrl's tree attention (slimrl.ops.tree_attention) in its place, as the parity test does
  (tests/patches/trainers/test_async_grpo.py), and answers None for peak FLOPs (MFU metrics off, as the patch does);
  the rest
  of stock, TRL's fused log-prob head included, runs unchanged.
* The step is what this bench measures, not the rollouts: the worker (TRL's RolloutWorkerProtocol) hands over
  pre-made samples (1 prompt of 64 random tokens x 8 completions of `--completion` random tokens per step, advantages
  of both signs), and the weight transfer (WeightTransferProtocol) reads each streamed weight and drops it.
* Model: a random 4-layer, 256-wide Llama at `--vocab` (`slimrl.testing.tiny_llama`), full fine-tuning, fp32 on CPU,
  AsyncGRPOConfig's default gradient checkpointing, fixed-count micro-batches of 8 samples (`token_budget=0`).
* Memory (bench/_common.py): "working" = peak RSS within `training_step` (the packed forward, the log-prob head, the
  loss, backward) minus RSS at its entry, max over steps; "peak" = the whole process's peak RSS. s/step is the mean
  over steps after the first (`--steps`, default 2). `--mem_limit_gb` (default 12): a child passing it is stopped.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from online_memory import table  # noqa: E402

import _arms as arms  # noqa: E402
from _common import write_results  # noqa: E402

QUICK = {"vocab": 2048, "completion": [16]}
PROMPT_TOKENS, GENERATIONS = 64, 8


class FixedRollouts:
    """A rollout worker (TRL's RolloutWorkerProtocol) whose buffer holds pre-made samples: no generation measured."""

    def __init__(self, samples: list):
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        for sample in samples:
            self.rollout_buffer.put(sample)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def update_model_version(self, model_version: int) -> None:
        pass

    def check_health(self, stale_after_s: float) -> None:
        raise RuntimeError("the bench ran out of pre-made samples")


class DroppedWeights:
    """A weight transfer (TRL's WeightTransferProtocol) that reads every streamed weight and keeps none."""

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator) -> None:
        for _ in iterator:
            pass

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def samples(vocab: int, completion: int, groups: int) -> list:
    """`groups` groups of GENERATIONS samples: a shared random prompt, random completions, advantages of both signs."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    rng = np.random.default_rng(0)
    out = []
    for group in range(groups):
        prompt = rng.integers(10, vocab, PROMPT_TOKENS).tolist()
        for index in range(GENERATIONS):
            ids = prompt + rng.integers(10, vocab, completion).tolist()
            out.append(
                RolloutSample(
                    prompt=[{"role": "user", "content": ""}],
                    completion=[{"role": "assistant", "content": ""}],
                    input_ids=np.array(ids),
                    completion_mask=np.array([0] * PROMPT_TOKENS + [1] * completion),
                    old_log_probs=np.full(len(ids), -float(np.log(vocab)), dtype=np.float32),
                    advantage=(-1.0, 0.5, 2.0)[index % 3],
                    model_version=0,
                    group_id=group,
                    metrics={"reward": 0.0},
                    enqueued_at=None,
                )
            )
    return out


def _stock_peak_flops_off_cuda() -> None:
    """Stock asks CUDA for the device's name in __init__ (MFU metrics): answer None, as the parity test does."""
    from trl.experimental.async_grpo import async_grpo_trainer

    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None


def _stock_attention_off_cuda() -> None:
    """Stock's packed rows through slimrl's tree attention in place of FlashAttention-3, as the parity test does."""
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import packing

    from slimrl.ops.tree_attention import tree_attention

    AttentionInterface.register(packing.TREE_ATTENTION, tree_attention)


def child(arm: str, vocab: int, completion: int, steps: int, mem_limit_gb: float) -> dict:
    record = {"arm": arm, "trainer": "async_grpo", "vocab": vocab, "completion": completion}
    state = arms.start_child(arm, "async_grpo", record, mem_limit_gb)
    import tempfile

    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from slimrl.testing import tiny_tokenizer

    if arm == "stock":
        _stock_peak_flops_off_cuda()
    tok = tiny_tokenizer(vocab)
    path = tempfile.mkdtemp(prefix="slimrl-bench-model-")
    arms.bench_model(vocab).save_pretrained(path)
    args = AsyncGRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        max_steps=steps,
        per_device_train_batch_size=GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=completion,
        token_budget=0,
        max_staleness=steps + 2,
        learning_rate=1e-5,
        **arms.CPU_TRAINING_ARGS,
    )
    worker = FixedRollouts(samples(vocab, completion, steps + 2))  # the data loader reads one micro-batch ahead
    trainer = AsyncGRPOTrainer(
        model=path,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * GENERATIONS}),
        processing_class=tok,
        rollout_worker=worker,
        weight_transfer=DroppedWeights(),
    )
    if arm == "stock":
        _stock_attention_off_cuda()  # after __init__, which registers TRL's kernel
    return arms.train_measured(trainer, record, state)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--completion", type=int, nargs="+", default=[256])
    arms.add_arm_options(p, QUICK, mem_limit_gb=12.0)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.completion = QUICK["vocab"], QUICK["completion"]
    if a.child:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        return arms.run_child(a.threads, child, a.child, a.vocab, a.completion[0], a.steps, a.mem_limit_gb)

    rows = []
    for completion in a.completion:
        row = {"trainer": "async_grpo", "vocab": a.vocab, "completion": completion}
        child_args = ["--vocab", str(a.vocab), "--completion", str(completion), "--steps", str(a.steps)]
        child_args += ["--threads", str(a.threads), "--mem_limit_gb", str(a.mem_limit_gb)]
        rows.append(arms.run_arms(row, child_args, a.threads, f"async_grpo C={completion}"))
    print(f"# AsyncGRPO, tiny Llama 4x256, full fine-tuning, 8 completions/step, CPU, {a.threads} thread(s)")
    print(table(rows, a.markdown))
    if a.json:
        write_results(a.json, {"threads": a.threads, "steps": a.steps, "limit_gib": a.mem_limit_gb, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
