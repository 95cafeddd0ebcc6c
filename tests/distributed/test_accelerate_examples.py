"""examples/accelerate/ launched as a user launches it: `accelerate launch --config_file <config> train.py`.

- ddp.yaml: patched GRPO, RLOO, DPO, KTO and ORPO one after the other in the same 2 CPU processes (accelerate's
  multi-GPU launcher is torchrun; slimrl resolves use_cpu): each trains with a world of 2, finite losses, and both
  ranks end with the same LoRA weights. ORPO under DDP is the regression check of the lean preference head's graph
  carrier (DDP's unused-parameter search used to fail on it).
- zero2.yaml / zero3.yaml: the same under DeepSpeed's CPU accelerator (when deepspeed is installed).
- fsdp2.yaml on CPUs: slimrl refuses with its message (accelerate would train DDP instead); fsdp2.yaml on GPUs is
  tests/gpu/test_gpu_distributed.py's.
"""

import json

import pytest

from _launch import ROOT, accelerate_launch

pytestmark = pytest.mark.distributed
EXAMPLES = ROOT / "examples/accelerate"
ALL = ("grpo", "rloo", "dpo", "kto", "orpo")


def _runs(output: str) -> dict:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith('{"algorithm"')]
    return {run["algorithm"]: run for run in lines}


def _assert_trained(runs: dict, algorithms, distributed_type: str) -> None:
    assert sorted(runs) == sorted(algorithms), runs
    for name, run in runs.items():
        assert run["world_size"] == 2 and run["distributed_type"] == f"DistributedType.{distributed_type}", run
        assert run["losses"] and all(abs(x) < 1e3 for x in run["losses"]), run
        assert run["ranks_in_sync"], f"{name}: the ranks ended with different weights"


def test_ddp_config_trains_every_algorithm(tmp_path):
    done = accelerate_launch(
        EXAMPLES / "ddp.yaml", EXAMPLES / "train.py", "--algorithm", ",".join(ALL), "--output_dir", tmp_path
    )
    _assert_trained(_runs(done.stdout), ALL, "MULTI_CPU")


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_configs_train(tmp_path, stage):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: bash scripts/install_deepspeed.sh")
    algorithms = ("grpo", "dpo") if stage == 3 else ("rloo", "orpo")
    done = accelerate_launch(
        EXAMPLES / f"zero{stage}.yaml",
        EXAMPLES / "train.py",
        "--algorithm",
        ",".join(algorithms),
        "--output_dir",
        tmp_path,
    )
    _assert_trained(_runs(done.stdout), algorithms, "DEEPSPEED")


def test_fsdp2_config_on_cpus_is_refused(tmp_path):
    done = accelerate_launch(
        EXAMPLES / "fsdp2.yaml", EXAMPLES / "train.py", "--algorithm", "dpo", "--output_dir", tmp_path, check=False
    )
    assert done.returncode != 0
    assert "FSDP was asked for, but the 2 processes train on CPUs" in done.stdout, done.stdout[-3000:]
