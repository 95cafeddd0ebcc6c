"""Host memory for activation offload (slimrl.patches.setup.offload_checks): the plan's figure is what the offloader's
pool
really allocates, and a trainer whose offloaded layer inputs would not fit the host's available memory is refused at
set-up, before the first step, naming both figures."""

import json

import pytest
import torch

from slimrl import PatchFastRL
from slimrl.models.checkpointing import (
    apply_checkpointing,
    checkpointing_mode,
    configure_offload,
    offloaded_checkpoint,
)
from slimrl.models.offload import ActivationOffloader
from slimrl.patches.setup import offload_checks
from slimrl.planning import plan
from slimrl.planning.terms import offload_host_bytes
from slimrl.testing import tiny_llama, tiny_llama_config, tiny_tokenizer

QUIET_CPU = dict(use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True)


@pytest.mark.parametrize("tokens, hidden", [(300, 1024), (512, 512), (100, 64)])
def test_the_plans_host_figure_is_what_the_offloaders_pool_allocates(tokens, hidden):
    """(300 x 1024 x 4 B: 1.2 MB, pooled as 2 MiB buffers; 512 x 512 x 4: exactly 1 MiB; 100 x 64 x 4: under
    MIN_BYTES, stays put.)"""
    layers = 4
    offloader = ActivationOffloader(host_tensors=True)
    weights = [torch.randn(hidden, hidden, requires_grad=True) for _ in range(layers)]
    x = torch.randn(tokens, hidden, requires_grad=True)
    h = x
    for w in weights:
        h = offloaded_checkpoint(offloader, {"use_reentrant": False}, lambda t, w=w: torch.tanh(t @ w), h)
    pooled = offloader.host_memory()["bytes"]
    assert pooled == offload_host_bytes(layers, hidden, 4, tokens).bytes
    assert pooled == (
        0 if tokens * hidden * 4 < 2**20 else (layers - 1) * (1 << (tokens * hidden * 4 - 1).bit_length())
    )
    h.sum().backward()  # the buffers go back to the pool, none is added
    assert offloader.host_memory()["bytes"] == pooled


def _args(tmp_path, **fields):
    from trl import GRPOConfig

    base = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8192, max_steps=1)
    return GRPOConfig(output_dir=str(tmp_path), **{**base, **QUIET_CPU, **fields})


def _meminfo(tmp_path, monkeypatch, kib: int) -> None:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {4 * kib} kB\nMemFree:        {kib} kB\nMemAvailable:   {kib} kB\n")
    monkeypatch.setattr(offload_checks, "MEMINFO", str(path))


def test_too_little_host_memory_is_refused_naming_both_figures(tmp_path, monkeypatch):
    model = tiny_llama(seed=0, hidden_size=32, num_layers=3)
    offloader = ActivationOffloader(host_tensors=True)
    needed, _ = offload_checks.offload_host_need(model, _args(tmp_path), offloader)
    # rows of 512 + 8192 tokens, one a group ("auto": 4,096 tokens), 8,704 x 32 x 4 B = 1.06 MiB -> 2 MiB x 2 layers
    assert needed == 2 * 2 * 2**20
    _meminfo(tmp_path, monkeypatch, kib=1024)
    assert offload_checks.available_host_bytes() == 2**20
    with pytest.raises(ValueError) as error:
        offload_checks.check_offload_host_memory(model, _args(tmp_path), offloader)
    message = str(error.value)
    assert "needs 4.0 MiB of host memory" in message and "has 1.0 MiB available" in message
    for remedy in ("slimrl_rows_per_group=1", "max_completion_length", "use_gradient_checkpointing=True"):
        assert remedy in message


def test_enough_host_memory_passes_and_a_cpu_offload_that_moves_nothing_is_not_checked(tmp_path, monkeypatch):
    model = tiny_llama(seed=0, hidden_size=32, num_layers=3)
    _meminfo(tmp_path, monkeypatch, kib=4096)  # exactly the 4 MiB needed
    offload_checks.check_offload_host_memory(model, _args(tmp_path), ActivationOffloader(host_tensors=True))
    _meminfo(tmp_path, monkeypatch, kib=1)
    offload_checks.check_offload_host_memory(model, _args(tmp_path), ActivationOffloader())  # CPU: nothing moves
    with pytest.raises(ValueError, match="activation offload needs"):  # the control: the same, moving host tensors
        offload_checks.check_offload_host_memory(model, _args(tmp_path), ActivationOffloader(host_tensors=True))


def _grpo_trainer(tmp_path):
    from datasets import Dataset
    from trl import GRPOTrainer

    model = apply_checkpointing(tiny_llama(seed=0, hidden_size=32, num_layers=3), "offload")  # get_peft_model's way
    configure_offload(model, host_tensors=True)  # a CPU run whose offload moves the layer inputs, as CUDA's does
    return GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=_args(tmp_path, gradient_checkpointing=True),
        train_dataset=Dataset.from_list([{"prompt": "what is 1 plus 2"}] * 4),
        processing_class=tiny_tokenizer(),
    )


def test_a_trainer_set_up_with_offload_is_refused_before_its_first_step(tmp_path, monkeypatch, unpatched):
    _meminfo(tmp_path, monkeypatch, kib=1024)
    _grpo_trainer(tmp_path)  # the control: stock TRL checks nothing
    PatchFastRL("grpo")
    with pytest.raises(ValueError, match=r"needs 4\.0 MiB of host memory.*has 1\.0 MiB available"):
        _grpo_trainer(tmp_path)
    _meminfo(tmp_path, monkeypatch, kib=4096)
    assert checkpointing_mode(_grpo_trainer(tmp_path).model) == "offload"


def test_the_plans_json_holds_the_host_figure():
    config = tiny_llama_config(hidden_size=256, num_layers=4)
    fields = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=4096)
    common = dict(device="cuda", device_memory_gb=80, prompt_length=512, dtype="bfloat16")
    offloaded = json.loads(
        json.dumps(plan(config, fields, "grpo", use_gradient_checkpointing="offload", **common).to_dict())
    )
    kept = plan(config, fields, "grpo", use_gradient_checkpointing=True, **common).to_dict()
    # one row a group: 4,608 tokens x 256 x 2 B = 2.25 MiB -> 4 MiB buffers, 3 layers of 4
    assert offloaded["host_offload_bytes"] == 3 * 4 * 2**20 and kept["host_offload_bytes"] == 0
    saved = "saved activations"
    assert offloaded["phases"]["policy backward"][saved] == 2 * 4608 * 256 * 2  # the one in use and the next
    assert kept["phases"]["policy backward"][saved] == 4 * 4608 * 256 * 2
    one = {**fields, "max_completion_length": 512, "per_device_train_batch_size": 1}
    short = plan(config, one, "grpo", use_gradient_checkpointing="offload", **common).to_dict()
    # 1 row x 1,024 tokens x 256 x 2 B = 0.5 MiB, under MIN_BYTES: the offloader moves nothing, and the plan says so
    assert short["host_offload_bytes"] == 0 and short["phases"]["policy backward"][saved] == 4 * 1024 * 256 * 2
