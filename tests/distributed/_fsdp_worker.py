"""slimrl's log-prob head under FSDP2 on CPU: `torch.distributed.fsdp.fully_shard` over gloo, 2 processes.

    torchrun --nproc_per_node 2 tests/distributed/_fsdp_worker.py OUT

Why not a whole trainer: accelerate maps FSDP only onto accelerator process groups (MULTI_GPU, XPU, ...); a CPU
launch is MULTI_CPU and accelerate's FSDP plugin does not apply there, so `accelerate launch --use_fsdp` of a TRL
trainer needs GPUs (tests/gpu). torch's FSDP2 itself runs on CPU with gloo, so what slimrl adds under FSDP2, the
head, is checked here the way TRL's trainers drive it:
- the head is installed before PEFT (TRL's order), the decoder layers and then the root (the PeftModel, as
  accelerate's `fsdp2_prepare_model` does) are `fully_shard`-ed, and the fused forward is called through the root,
  so FSDP2's pre-forward hook unshards the root's own parameters (embeddings, norm, LM head) and its post-backward
  hook reduce-scatters the LoRA gradients;
- the root reshards after forward (not FSDP2's root default), so the backward must re-gather the head weight the
  custom autograd function saved: the hardest case for a head that reads `lm_head.weight` without calling lm_head;
- outside any forward the head weight is a sharded DTensor: `_head_weights` must gather it (TRL's `full_tensor()`).
Each rank scores its half of one batch (the global batch is the 1-process run's); the loss is the sum of the rank's
log-probs x world / (all valid tokens), so FSDP2's gradient average is the 1-process mean over the whole batch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import _tiny as T
from _launch import leave_without_interpreter_teardown

OUTPUTS = ("log_probs", "entropy")
PROMPT_LEN = 4


def batch(rows: int = 4, length: int = 11):
    """Token ids, attention mask and labels (prompt and left padding -100) of a fixed batch."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(4, T.VOCAB, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 3] = 0  # left padding of 0-2 tokens
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :PROMPT_LEN] = -100
    return ids, mask, labels


def model(dtype=torch.float32, head=None):
    """Tiny Llama with the head installed (slimrl's by default), then LoRA (TRL's order); seeded."""
    from peft import get_peft_model

    from slimrl.ops.logprob import add_fused_lm_head

    base = T.tiny_model(0).to(dtype)
    (head or add_fused_lm_head)(base, outputs=OUTPUTS)
    torch.manual_seed(7)
    return get_peft_model(base, T.lora_config())


def score(peft_model, rows: slice, total_tokens: int, world: int = 1):
    """(per-token log-probs and entropies of `rows`, the loss whose backward gives the gradients)."""
    ids, mask, labels = (x[rows] for x in batch())
    out = peft_model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    loss = -out.log_probs.sum() * world / total_tokens
    return out.log_probs, out.entropy, loss


def lora_grads(peft_model) -> dict:
    grads = {}
    for name, param in peft_model.named_parameters():
        if param.requires_grad and param.grad is not None:
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return grads


def main(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from slimrl.ops import logprob

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    peft_model = model()
    full_head = peft_model.get_base_model().lm_head.weight.detach().clone()
    for layer in peft_model.get_base_model().model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(peft_model, mesh=mesh, reshard_after_forward=True)
    assert isinstance(peft_model, FSDPModule)
    lm_head = peft_model.get_base_model().lm_head
    sharded = type(lm_head.weight).__name__, tuple(lm_head.weight.to_local().shape)
    gathered, _ = logprob._head_weights(lm_head)  # outside a forward: a DTensor, gathered as TRL does
    seen, original = [], logprob.fused_logprobs

    def recorded(hidden, weight, *rest, **kwargs):
        seen.append((type(weight).__name__, tuple(weight.shape)))
        return original(hidden, weight, *rest, **kwargs)

    logprob.fused_logprobs = recorded
    ids, _, labels = batch()
    per_rank = ids.shape[0] // world
    total_tokens = int((labels[:, 1:] != -100).sum())
    log_probs, entropy, loss = score(peft_model, slice(rank * per_rank, (rank + 1) * per_rank), total_tokens, world)
    loss.backward()
    result = dict(
        log_probs=log_probs.detach(),
        entropy=entropy.detach(),
        grads=lora_grads(peft_model),
        sharded_head=sharded,
        gathered_head_equal=bool(torch.equal(gathered, full_head)),
        head_seen=seen,
    )
    results = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    leave_without_interpreter_teardown()
