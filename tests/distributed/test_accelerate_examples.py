"""examples/accelerate/ launched as a user launches it: `accelerate launch --config_file <config> train.py`.

- ddp.yaml: patched GRPO, RLOO, DPO, KTO and ORPO one after the other in the same 2 CPU processes (accelerate's
  multi-GPU launcher is torchrun; slimrl resolves use_cpu): each trains with a world of 2, finite losses, and both
  ranks end with the same LoRA weights. ORPO under DDP is the regression check of the lean preference head's graph
  carrier (DDP's unused-parameter search used to fail on it).
- zero2.yaml / zero3.yaml: the same under DeepSpeed's CPU accelerator (when deepspeed is installed).
- The example frees its models before it destroys the process group (end_processes; its docstring says why a DDP
  reducer that outlives the group can hang the rank): _reducer_worker.py trains with the example's train_one and ends
  with its end_processes, and no DDP model may be alive when the group is destroyed; with one still referenced (the
  negative control) the count is one.
- The example leaves with os._exit(0) (its docstring says why) only once every run has finished: a later run that
  raises still fails the launch, after the earlier run's results were printed. _exit_worker.py recreates the abort it
  avoids (gloo's thread touching Python while the interpreter shuts down) and checks that the exit avoids it; the
  same script ending the ordinary way is the negative control, which must abort.
- fsdp2.yaml on CPUs: slimrl refuses with its message (accelerate would train DDP instead); fsdp2.yaml on GPUs is
  tests/gpu/test_gpu_distributed.py's.
"""

import json

import pytest

from _launch import ROOT, accelerate_launch, torchrun

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


def test_example_failure_after_a_finished_run_still_fails_the_launch(tmp_path):
    done = torchrun(EXAMPLES / "train.py", "--algorithm", "dpo,not_an_algorithm", "--output_dir", tmp_path, check=False)
    assert list(_runs(done.stdout)) == ["dpo"], done.stdout[-3000:]
    assert done.returncode != 0
    assert "Unknown algorithm 'not_an_algorithm'" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("ending", ["hard", "plain"])
def test_example_exit_avoids_the_abort_at_interpreter_shutdown(ending):
    done = torchrun(ROOT / "tests/distributed/_exit_worker.py", ending, check=False)
    if ending == "hard":
        assert done.returncode == 0, done.stdout[-3000:]
    else:
        assert done.returncode != 0
        assert "terminate called without an active exception" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("mode", ["example", "held"])
def test_example_frees_its_models_before_ending_the_group(tmp_path, mode):
    done = torchrun(ROOT / "tests/distributed/_reducer_worker.py", mode, tmp_path)
    line = next(x for x in done.stdout.splitlines() if x.startswith('{"live_ddp_models'))
    assert json.loads(line)["live_ddp_models_when_the_group_ends"] == ([0] if mode == "example" else [1]), line
