"""Patched AsyncGRPOTrainer (trl.experimental.async_grpo) trains on CPU, with rollouts produced while it trains.

TRL's AsyncGRPO needs CUDA twice: its packed rows go through a FlashAttention-3 kernel fetched from the Hub, and its
default weight sync is NCCL into a vLLM server. Under `PatchFastRL("async_grpo")` the packed rows go through
slimrl.ops.tree_attention off CUDA (its parity with per-sample forwards: tests/ops/test_tree_attention.py) and the
log-probs through slimrl's lean head. Rollouts come from TRL's own plug-in protocols, implemented in-process
(_async_rollouts.py: a sampling thread with its own copy of the policy, weights copied in at every sync).
- training: losses finite, weights moved, the tree attention ran, the worker's policy equals the trained one after
  the last sync, and the staleness TRL reports stays within `max_staleness`;
- staleness: samples older than `max_staleness` are dropped and counted (`sample/dropped_stale_total`);
- a model with attention logit softcapping is refused off CUDA, naming the option, before it is loaded;
- parity: the loss and gradients of one packed micro-batch, patched vs stock TRL's head (both through slimrl's tree
  attention, as FlashAttention-3 cannot run here, and without MFU metrics, which need CUDA) by the parity rule
  against the float64 stock side.
"""

from __future__ import annotations

import os

import pytest
import torch

from slimrl import PatchFastRL
from slimrl.patches import registry

import _async_rollouts as A
import _parity as P
import _tiny as T


@pytest.fixture(autouse=True)
def _quiet_experimental(monkeypatch):
    monkeypatch.setitem(os.environ, "TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture
def attention_calls(monkeypatch):
    from slimrl.ops import tree_attention as ta

    calls, real = [], ta.tree_mask
    monkeypatch.setattr(ta, "tree_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _config(tmp_path, **overrides):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    kw = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        token_budget=0,  # fixed-count micro-batches: no server to ask for its context length
        max_staleness=1,
        learning_rate=1e-2,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        dataloader_pin_memory=False,
        seed=0,
    )
    kw.update(overrides)
    return AsyncGRPOConfig(**kw)


def _trainer(model_path, args, worker, peft_config=None):
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    return AsyncGRPOTrainer(
        model=model_path,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": T.PROMPTS}),
        processing_class=T.tokenizer(),
        rollout_worker=worker,
        weight_transfer=A.LocalWeightTransfer(worker),
        peft_config=peft_config,
    )


def _logged(trainer, key):
    return [log[key] for log in trainer.state.log_history if key in log]


def test_trains_on_cpu_with_rollouts_while_training(tmp_path, saved_model, unpatched, attention_calls):
    PatchFastRL("async_grpo")
    worker = A.LocalRolloutWorker(saved_model, T.PROMPTS, num_generations=2, max_new_tokens=8)
    trainer = _trainer(saved_model, _config(tmp_path), worker)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    losses = _logged(trainer, "loss")
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses))), losses
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert attention_calls, "the packed rows did not go through slimrl's tree attention"
    assert trainer.weight_transfer.syncs == 4  # the cold sync at train begin, then one per step
    trained = dict(trainer.model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in worker.model.named_parameters())
    staleness = _logged(trainer, "sample/staleness_max")
    assert staleness and max(staleness) <= 1, staleness
    assert max(worker.versions_produced) >= 2, "the worker never sampled from an updated policy"


@pytest.mark.slow
def test_lora_trains_and_hands_over_the_merged_policy(tmp_path, saved_model, unpatched, attention_calls):
    """A LoRA policy: TRL folds the adapter into the base weights for each sync; the worker samples from them."""
    PatchFastRL("async_grpo")
    worker = A.LocalRolloutWorker(saved_model, T.PROMPTS, num_generations=2, max_new_tokens=8)
    trainer = _trainer(saved_model, _config(tmp_path), worker, peft_config=T.lora_config())
    trainer.train()
    assert len(_logged(trainer, "loss")) == 3 and attention_calls
    model = trainer.model
    model.merge_adapter()
    try:
        merged = {
            n.removeprefix("base_model.model.").replace(".base_layer", ""): p for n, p in model.named_parameters()
        }
        assert all(torch.allclose(p, merged[n]) for n, p in worker.model.named_parameters())
    finally:
        model.unmerge_adapter()
    assert any(
        not torch.equal(p, q) for p, q in zip(worker.model.parameters(), T.load_tiny(saved_model).parameters())
    ), "the adapter never reached the worker"


def test_stale_samples_are_dropped_and_counted(tmp_path, saved_model, unpatched):
    PatchFastRL("async_grpo")
    worker = A.LocalRolloutWorker(saved_model, T.PROMPTS, num_generations=2, max_new_tokens=4)
    for sample in worker._group(0):  # sampled by a policy three versions behind the first sync
        sample.model_version = -2
        worker.rollout_buffer.put(sample)
    trainer = _trainer(saved_model, _config(tmp_path, max_steps=1, max_staleness=1), worker)
    trainer.train()
    assert sum(_logged(trainer, "sample/dropped_stale_total")) == 2
    assert max(_logged(trainer, "sample/staleness_max")) <= 1


def _micro_batch_loss(tmp_path, model_path, samples, side):
    """(loss, gradients) of one micro-batch of `samples` on one side: "stock" / "reference" (float64) unpatched with
    slimrl's tree attention registered in place of FlashAttention-3, "patched" under PatchFastRL."""
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import packing

    from slimrl.ops.tree_attention import tree_attention

    registry.unpatch()
    if side == "patched":
        PatchFastRL("async_grpo")
    worker = A.LocalRolloutWorker(model_path, T.PROMPTS, num_generations=2, max_new_tokens=4)
    for sample in samples:
        worker.rollout_buffer.put(sample)
    trainer = _trainer(model_path, _config(tmp_path / side), worker)
    if side == "reference":
        trainer.model.double()
    try:
        if side != "patched":
            AttentionInterface.register(packing.TREE_ATTENTION, tree_attention)
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train otherwise
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    finally:
        packing.register_tree_attention()
        registry.unpatch()
    return loss.detach(), grads


def test_micro_batch_parity_with_stock_head(tmp_path, saved_model, unpatched, monkeypatch):
    from trl.experimental.async_grpo import async_grpo_trainer

    # stock TRL asks CUDA for the device's name (for MFU metrics) in __init__; here it gets TRL's "unknown device"
    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda accelerator, dtype: None)
    worker = A.LocalRolloutWorker(saved_model, T.PROMPTS, num_generations=2, max_new_tokens=6)
    # two micro-batches: the data loader reads one ahead
    samples = [sample for group in range(4) for sample in worker._group(group)]
    for index, sample in enumerate(samples):  # advantages of both signs, none zero (equal rewards give zeros)
        sample.advantage = (-1.0, 0.5, 2.0)[index % 3]
    sides = {
        side: _micro_batch_loss(tmp_path, saved_model, samples, side) for side in ("stock", "patched", "reference")
    }
    assert sides["reference"][1].abs().max() > 0, "a batch with no gradient compares nothing"
    for index, what in enumerate(("loss", "gradients")):
        P.check(f"async_grpo {what}", *(sides[side][index] for side in ("patched", "stock", "reference")))


def test_softcapping_model_refused_before_loading(tmp_path, unpatched):
    from transformers import AutoConfig

    path = str(tmp_path / "gemma2")
    AutoConfig.for_model("gemma2", attn_logit_softcapping=50.0).save_pretrained(path)  # a config, no weights
    PatchFastRL("async_grpo")
    worker = A.LocalRolloutWorker.__new__(A.LocalRolloutWorker)  # never used: the check comes first
    with pytest.raises(NotImplementedError, match="attn_logit_softcapping=50.0"):
        _trainer(path, _config(tmp_path), worker)


def test_unpatched_registers_trls_kernel_again(unpatched):
    from trl.experimental.async_grpo import packing

    stock = packing.tree_attention
    PatchFastRL("async_grpo")
    assert packing.tree_attention is not stock
    registry.unpatch()
    assert packing.tree_attention is stock


def test_a_registered_function_outliving_unpatch_is_trls_again(unpatched, monkeypatch):
    """transformers' attention registry keeps what a patched trainer registered; after unpatch() it runs TRL's."""
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import packing

    stock = packing.tree_attention
    calls = []

    def trls(module, query, key, value, attention_mask, **kwargs):  # stands in for TRL's FlashAttention-3 kernel
        calls.append("trl")

    monkeypatch.setattr(packing, "tree_attention", trls)
    PatchFastRL("async_grpo")
    packing.register_tree_attention()  # what a trainer built while patched does
    registered = AttentionInterface._global_mapping[packing.TREE_ATTENTION]
    assert registered is packing.tree_attention  # slimrl's
    registry.unpatch()
    query = torch.zeros(1, 1, 2, 4)
    try:
        registered(None, query, query, query, None)
    finally:
        AttentionInterface.register(packing.TREE_ATTENTION, stock)
    assert calls == ["trl"]
