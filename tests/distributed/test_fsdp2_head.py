"""slimrl's log-prob head under FSDP2 on CPU (fully_shard over gloo, 2 processes; see _fsdp_worker for the set-up
and why the whole trainer under accelerate's FSDP needs GPUs: tests/gpu/test_gpu_distributed.py).

Checked: inside the root's forward the head sees the full [V, H] weight FSDP2 unsharded (a plain tensor), outside it
a sharded DTensor that `_head_weights` gathers to the exact full weight; the per-token log-probs and entropies of
both ranks' halves and the reduce-scattered LoRA gradients equal the 1-process run on the whole batch by _parity's
rule (1-process float32 in stock's place, float64 naive head as the reference), the backward re-gathering a head
weight the root resharded after forward; a 0.1% gradient error fails (negative control).
"""

import pytest
import torch

import _fsdp_worker as F
import _parity as P
from _launch import ROOT, torchrun
from _reference import naive_fused_lm_head, perturb_rounding

pytestmark = pytest.mark.distributed
WORLD = 2


def _one_process(side: str) -> dict:
    dtype, head = (torch.float32, None) if side == "patched" else (torch.float64, naive_fused_lm_head)
    model = F.model(dtype, head)
    if side in P.PERTURBATION_SEEDS:
        perturb_rounding(model, P.PERTURBATION_SEEDS[side])
    ids, _, labels = F.batch()
    log_probs, entropy, loss = F.score(model, slice(None), int((labels[:, 1:] != -100).sum()))
    loss.backward()
    return dict(log_probs=log_probs.detach(), entropy=entropy.detach(), grads=F.lora_grads(model))


def test_head_under_fsdp2_equals_one_process(tmp_path):
    out = tmp_path / "fsdp.pt"
    torchrun(ROOT / "tests/distributed/_fsdp_worker.py", out)
    ranks = torch.load(out, weights_only=False)
    for rank in ranks:
        assert rank["sharded_head"] == ("DTensor", (F.T.VOCAB // WORLD, F.T.HIDDEN))
        assert rank["gathered_head_equal"], "_head_weights did not gather the sharded head exactly"
        assert rank["head_seen"] == [("Parameter", (F.T.VOCAB, F.T.HIDDEN))], rank["head_seen"]
    one = [_one_process(side) for side in ("patched", *P.FLOAT64_SIDES)]
    for key in ("log_probs", "entropy"):
        P.check(key, torch.cat([r[key] for r in ranks]), *(o[key] for o in one))
    grads = ranks[0]["grads"]
    assert grads.keys() == one[0]["grads"].keys() and grads
    for name, grad in grads.items():
        assert torch.equal(grad, ranks[1]["grads"][name]), f"{name}: ranks hold different gradients"
        P.check(f"gradient of {name}", grad, *(o["grads"][name] for o in one))
        with pytest.raises(AssertionError, match="patched - ref"):  # negative control
            P.check(f"control {name}", grad * 1.001, *(o["grads"][name] for o in one))
