"""Per-rank memory of stock TRL vs slimrl GRPO under DDP (torchrun), and what DDP sends per optimizer step.

    PYTHONPATH=src python bench/ddp_memory.py --vocab 32768 152064 --completion 256 --steps 2 --threads 1
    PYTHONPATH=src python bench/ddp_memory.py --quick          (smoke: V=32k, C=32, 1 step, a few minutes on 2 cores)

Choices:
* The run is bench/grpo_memory.py's GRPO child (random 4-layer, 256-wide Llama, LoRA r=16 on every projection,
  G=8 completions of one prompt per process per step, fp32, `use_cpu=True`), imported, not copied, so the 1-process
  figures of that bench and these per-rank ones measure the same thing. Each (arm, world size) is one torchrun
  launch (`--nproc_per_node` 1 or 2, gloo on CPU, NCCL on GPUs), one after the other.
* Per rank: "peak" (VmHWM of that process, or CUDA max allocated) and "working" (the policy forward+backward's own
  peak above its start), gathered to rank 0. On a shared machine the RSS figures move little; times are not taken.
* Communication per optimizer step is counted, not timed: DDP all-reduces every trainable gradient once per step
  (fp32 LoRA weights: 4 bytes x trainable parameters, whatever the world size; a ring all-reduce moves about
  2 (N-1)/N of that per rank), plus GRPO's gathers of completions and rewards (a few KiB). slimrl changes neither.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import pin_threads, results_path, write_results  # noqa: E402

MiB = 1024**2


def child(arm: str, vocab: int, completion: int, steps: int, device: str) -> None:
    """One rank of a torchrun launch: the GRPO run, then every rank's figures gathered to rank 0, printed there."""
    import grpo_memory
    import torch.distributed as dist

    result = grpo_memory.child_grpo(arm, vocab, completion, steps, device)
    ranks = [result]
    if dist.is_available() and dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, result)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"ranks": ranks}), flush=True)


def launch(arm: str, nproc: int, vocab: int, completion: int, steps: int, threads: int, device: str) -> dict:
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        os.path.abspath(__file__),
        "--child",
        arm,
        "--vocab",
        str(vocab),
        "--completion",
        str(completion),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--device",
        device,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith('{"ranks"'):
            return json.loads(line)
    return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-3000:]}"}


def table(rows: list[dict]) -> str:
    lines = [
        "| vocab | C | processes | arm | per-rank peak MiB | per-rank working MiB | all-reduced per step |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row["result"]:
            lines.append(f"| {row['vocab']} | {row['completion']} | {row['nproc']} | {row['arm']} | error | | |")
            continue
        ranks = row["result"]["ranks"]
        peaks = " / ".join(f"{r['peak'] / MiB:.0f}" for r in ranks)
        working = " / ".join(f"{r['working'] / MiB:.0f}" for r in ranks)
        lines.append(
            f"| {row['vocab']} | {row['completion']} | {row['nproc']} | {row['arm']} | {peaks} | {working} "
            f"| {ranks[0]['grad_bytes'] / MiB:.2f} MiB |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 152064])
    p.add_argument("--completion", type=int, nargs="+", default=[256])
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per process")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--quick", action="store_true", help="V=32k, C=32, 1 step")
    p.add_argument("--json", default=results_path("ddp_memory"), help="the results file")
    p.add_argument("--child", choices=["stock", "slimrl"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        pin_threads(a.threads)
        child(a.child, a.vocab[0], a.completion[0], a.steps, a.device)
        return 0
    if a.quick:
        a.vocab, a.completion, a.steps = [32768], [32], 1
    rows = []
    for vocab in a.vocab:
        for completion in a.completion:
            for nproc in a.processes:
                for arm in ("stock", "slimrl"):
                    result = launch(arm, nproc, vocab, completion, a.steps, a.threads, a.device)
                    rows.append(dict(vocab=vocab, completion=completion, nproc=nproc, arm=arm, result=result))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        f"# GRPO per rank under DDP (torchrun), tiny Llama 4x256, LoRA r=16, G=8 per rank, {a.steps} step(s), "
        f"{a.device}, {a.threads} thread(s) per process"
    )
    print(table(rows))
    write_results(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
