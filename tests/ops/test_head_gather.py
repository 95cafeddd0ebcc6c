"""slimrl's head gathers a partitioned LM head the way TRL does (`trl.trainer.utils.maybe_gather_lm_head_ctx`), in the
forward (logprob._scored_outputs) and again in the backward (LeanLogProbFunction, like TRL's kernel), since ZeRO-3 may
re-partition the weight between the two. The real partitioned runs are in the distributed tier (ZeRO-3 and FSDP2 on
CPU); here the context is recorded."""

import contextlib

import torch

from slimrl.ops.logprob import add_fused_lm_head
from slimrl.testing import tiny_llama


def test_forward_and_backward_enter_the_gather_context(monkeypatch):
    from trl.trainer import utils as trl_utils

    entered = []

    @contextlib.contextmanager
    def recorder(*params):
        entered.append(tuple(id(p) for p in params))
        yield

    monkeypatch.setattr(trl_utils, "maybe_gather_lm_head_ctx", recorder)
    model = tiny_llama(vocab_size=128, hidden_size=16, num_layers=1)
    add_fused_lm_head(model)
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    out = model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert len(entered) == 1, "the forward did not gather the head"
    out.loss.backward()
    head = model.get_output_embeddings()
    assert entered == [(id(head.weight), id(None))] * 2, "the backward did not gather the head again"
    assert head.weight.grad is not None and torch.isfinite(head.weight.grad).all()
