"""AsyncGRPO (trl.experimental.async_grpo.AsyncGRPOTrainer): TRL's asynchronous GRPO, patched.

TRL's AsyncGRPOTrainer trains on rollouts a worker produces while training goes on (by default from a vLLM server,
`trl vllm-serve`), packed into prefix-trie rows (packing.TreeRow) and scored by a fused log-prob head.
Patched:
1. `add_fused_lm_head`, the name the trainer's module calls in `__init__`: slimrl's lean head (slimrl.ops.logprob)
   scores only the packed row's trained positions, in bounded chunks.
2. `packing.tree_attention`, the attention function TRL registers for the packed rows: on a device other than CUDA,
   slimrl.ops.tree_attention (one SDPA call with the trie's block mask) in place of TRL's FlashAttention-3 kernel,
   which is fetched from the Hub and runs on CUDA only; on CUDA TRL's kernel runs unchanged.
3. `get_peak_flops_per_device`, which asks CUDA for the device's name: off CUDA it answers None, TRL's own answer for
   a device it has no peak FLOPs for (MFU metrics off; throughput and timings still logged).
TRL's own: the rollout worker, packing, the loss, weight sync (NCCL into the server, or the LoRA adapter handed over
through a server started with `--enable-lora`), the staleness bound `max_staleness` (a sample whose policy version is
older is dropped; `sample/staleness_mean|max` and `sample/dropped_stale_total` are logged).
4. `AsyncGRPOTrainer.__init__`: off CUDA, a model whose config asks for attention logit softcapping
   (`attn_logit_softcapping`, Gemma 2) is refused before it is loaded, naming the option: slimrl's tree attention has
   no softcapping (the attention function refuses it too).
"""

from __future__ import annotations

import functools
import sys

from ..seams import Patch
from ..setup.trainer_setup import fused_head_patch

TRAINER_MODULE = "trl.experimental.async_grpo.async_grpo_trainer"
PACKING_MODULE = "trl.experimental.async_grpo.packing"
TREE_ATTENTION_PARAMS = ("module", "query", "key", "value", "attention_mask")


def make_tree_attention(original):
    @functools.wraps(original)
    def tree_attention(module, query, key, value, attention_mask, **kwargs):
        # A trainer built while patched registered this function in transformers' attention registry, which
        # unpatch() does not own: once the module's seam is TRL's again, so is this function.
        still_patched = getattr(sys.modules.get(PACKING_MODULE), "tree_attention", None) is tree_attention
        if query.is_cuda or not still_patched:
            return original(module, query, key, value, attention_mask, **kwargs)
        from ...ops.tree_attention import tree_attention as sdpa_tree_attention

        return sdpa_tree_attention(module, query, key, value, attention_mask, **kwargs)

    return tree_attention


def make_peak_flops(original):
    @functools.wraps(original)
    def get_peak_flops_per_device(accelerator, dtype):
        if accelerator.device.type != "cuda":
            return None
        return original(accelerator, dtype)

    return get_peak_flops_per_device


def check_softcap(model, args) -> None:
    """Refuse, off CUDA, a model path whose config asks for attention logit softcapping."""
    import torch
    from transformers import AutoConfig

    if not isinstance(model, str) or (torch.cuda.is_available() and not (args is not None and args.use_cpu)):
        return
    trust_remote_code = bool(args is not None and args.trust_remote_code)
    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code).get_text_config()
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap:
        raise NotImplementedError(
            f"AsyncGRPOTrainer off CUDA: {type(config).__name__}.attn_logit_softcapping={softcap} is not supported by "
            "slimrl's tree attention (TRL's FlashAttention-3 kernel supports it on CUDA)."
        )


def make_init(original):
    @functools.wraps(original)
    def __init__(self, model, reward_funcs=None, args=None, *rest, **kwargs):
        check_softcap(model, args)
        original(self, model, reward_funcs, args, *rest, **kwargs)

    return __init__


PATCHES = [
    fused_head_patch(TRAINER_MODULE),
    Patch(
        PACKING_MODULE,
        "tree_attention",
        TREE_ATTENTION_PARAMS,
        make_tree_attention,
        "packed prefix-trie rows off CUDA: one SDPA call with the trie's block mask (FlashAttention-3 on CUDA)",
        requires=((PACKING_MODULE, "register_tree_attention", ()),),
    ),
    Patch(
        TRAINER_MODULE,
        "get_peak_flops_per_device",
        ("accelerator", "dtype"),
        make_peak_flops,
        "off CUDA, no peak FLOPs (MFU metrics off) instead of asking CUDA for the device's name",
    ),
    Patch(
        f"{TRAINER_MODULE}.AsyncGRPOTrainer",
        "__init__",
        ("self", "model", "reward_funcs", "args"),
        make_init,
        "off CUDA, a model with attention logit softcapping refused before it is loaded",
    ),
]
