"""The patched trainers under accelerate's GPU-only distribution: FSDP2 and DeepSpeed ZeRO-3 on CUDA, and DDP over
two GPUs against one GPU at twice the batch.

Why GPU-only: accelerate applies FSDP only to accelerator process groups (a CPU launch is MULTI_CPU, where slimrl
refuses an FSDP config rather than let it train DDP); the head itself under FSDP2 is checked on CPU
(tests/distributed/test_fsdp2_head.py, torch's fully_shard over gloo), ZeRO-2/3 and DDP on CPU in the same tier.
Here the launches are the examples' (examples/accelerate/*.yaml, train.py), on as many GPUs as the machine has
(FSDP2 and ZeRO-3 also run on one: the hooks, the sharded head and the gathered weights are the same code). The
2-GPU equivalence needs two GPUs and says so when skipped.
"""

import json
import subprocess
import sys

import pytest
import torch

from _gpu_helpers import MARKS
from _launch import ROOT, process_env, torchrun

pytestmark = MARKS

EXAMPLES = ROOT / "examples/accelerate"


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _launch_example(config: str, algorithms: str, tmp_path) -> list[dict]:
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(EXAMPLES / config),
        "--num_processes",
        str(max(1, _gpus())),
        str(EXAMPLES / "train.py"),
        "--algorithm",
        algorithms,
        "--output_dir",
        str(tmp_path),
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-6000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"algorithm"')]


@pytest.mark.parametrize("config,kind", [("fsdp2.yaml", "FSDP"), ("zero3.yaml", "DEEPSPEED")])
def test_example_trains_under_gpu_distribution(tmp_path, config, kind):
    if kind == "DEEPSPEED":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed on this GPU machine")
    runs = _launch_example(config, "grpo,dpo", tmp_path)
    assert [r["algorithm"] for r in runs] == ["grpo", "dpo"]
    for run in runs:
        assert run["distributed_type"] == f"DistributedType.{kind}" and run["world_size"] == max(1, _gpus()), run
        assert run["losses"] and all(abs(x) < 1e3 for x in run["losses"]) and run["ranks_in_sync"], run


def test_two_gpus_equal_one_at_twice_the_batch(tmp_path):
    if _gpus() < 2:
        pytest.skip(
            f"needs 2 GPUs, this machine has {_gpus()} (the same check runs on 2 CPU processes: "
            "tests/distributed/test_ddp_equivalence.py)"
        )
    import _dist_worker as W
    import _parity as P

    out = tmp_path / "dpo-2gpu.pt"
    torchrun(ROOT / "tests/distributed/_dist_worker.py", "dpo", "patched", 2, out)
    two = torch.load(out, weights_only=False)
    one = {side: W.run("dpo", side, 4, str(tmp_path / side)) for side in ("patched", *P.FLOAT64_SIDES)}
    assert two["world_size"] == 2
    for i, grads in enumerate(two["grads"]):
        for name, grad in grads.items():
            P.check(f"step {i}: gradient of {name}", grad.cpu(), *(one[s]["grads"][i][name].cpu() for s in one))
