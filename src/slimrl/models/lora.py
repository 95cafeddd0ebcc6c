"""LoRA adapters for FastLanguageModel.get_peft_model (peft `LoraConfig` + `get_peft_model`).

Choices:
- target_modules=None targets every Linear layer inside the repeated decoder blocks (q/k/v/o/gate/up/down for
  Llama-likes; whatever the architecture names them otherwise), found by walking the model, never lm_head or
  embeddings. Decoder blocks are transformers' `GradientCheckpointingLayer`s, else the longest `nn.ModuleList`.
- random_state seeds the adapter init inside `torch.random.fork_rng`, so the same seed gives the same adapter
  and the caller's global RNG stream is left as it was.
- Keywords that are LoraConfig fields pass through; Unsloth-only keywords are warned about and dropped
  (`max_seq_length` is honoured: it updates `model.max_seq_length`).
- Checkpointing is configured through checkpointing.apply_checkpointing, which also pins it against TRL.
- The LoRA layers get slimrl's two speed levers (lora_speed.speed_up_lora): `skip_lora_input_casts` (default True:
  PEFT's fp32 input copy skipped where autocast would cast it straight back; exact) and `fused_lora` (default
  "auto": the fused LoRA forward on CUDA models only). Both are recorded swaps, listed by `slimrl.describe`.
- `liger_kernel` (default "auto"): Liger-Kernel's RMSNorm, RoPE and SwiGLU on a CUDA model when liger-kernel is
  installed (slimrl.models.liger; recorded swaps too; on CPU or without it, one notice and nothing changes).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import torch
from torch import nn

from ..state import set_peft_owner
from . import adapters, checkpointing, liger, loading, lora_speed

logger = logging.getLogger("slimrl")

_UNSLOTH_ONLY = ("temporary_location", "ensure_weight_tying", "use_dora_unsloth", "qat_scheme")


def decoder_layers(model) -> list[nn.Module]:
    """The repeated transformer blocks of `model`."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def is_linear(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):  # bitsandbytes Linear4bit is a subclass
        return True
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, Conv1D)


def default_target_modules(model) -> list[str]:
    """Names (last path component) of the Linear layers inside the decoder blocks, sorted."""
    names = set()
    for layer in decoder_layers(model):
        for name, module in layer.named_modules():
            if name and is_linear(module):
                names.add(name.rsplit(".", 1)[-1])
    names.discard("lm_head")
    if not names:
        raise ValueError(
            f"Found no Linear layers inside the decoder blocks of {type(model).__name__}; "
            "pass target_modules explicitly."
        )
    return sorted(names)


def check_target_modules(model, target_modules) -> None:
    """Every name in a list of target modules must name some module of `model` (peft matches a full name or its last
    components); a regex string is left to peft. Raises naming the missing ones and the projections the model has."""
    if isinstance(target_modules, str) or target_modules == "all-linear":
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise ValueError(
            f"target_modules {missing} are not modules of {type(model).__name__}. Its projections: "
            f"{default_target_modules(model)} (target_modules=None takes them all)."
        )


def get_peft_model(
    model,
    *,
    r: int,
    target_modules,
    lora_alpha: int,
    lora_dropout: float,
    bias: str,
    use_gradient_checkpointing,
    random_state: int,
    fused_lora=lora_speed.AUTO,
    skip_lora_input_casts=True,
    liger_kernel=lora_speed.AUTO,
    **peft_kwargs,
):
    """Wrap `model` in a LoRA PeftModel and configure checkpointing; see FastLanguageModel.get_peft_model, whose
    signature owns the LoRA arguments' defaults (every one is passed here by name)."""
    from peft import LoraConfig, PeftModel
    from peft import get_peft_model as peft_get_peft_model

    mode = checkpointing.normalize_mode(use_gradient_checkpointing)
    lora_speed.validate_lever("fused_lora", fused_lora)
    lora_speed.validate_lever("skip_lora_input_casts", skip_lora_input_casts)
    lora_speed.validate_lever("liger_kernel", liger_kernel)
    if isinstance(model, PeftModel):
        warnings.warn(
            "get_peft_model: the model already has LoRA adapters; returning it unchanged (checkpointing mode updated).",
            stacklevel=3,
        )
        return checkpointing.apply_checkpointing(model, mode)

    max_seq_length = peft_kwargs.pop("max_seq_length", None)
    if max_seq_length is not None:
        loading.set_max_seq_length(model, max_seq_length)
    for key in _UNSLOTH_ONLY:
        if key in peft_kwargs:
            warnings.warn(
                f"get_peft_model: `{key}` is an Unsloth option with no effect in slimrl; ignored.", stacklevel=3
            )
            peft_kwargs.pop(key)
    lora_fields = {f.name for f in dataclasses.fields(LoraConfig)}
    unknown = sorted(set(peft_kwargs) - lora_fields)
    if unknown:
        raise TypeError(f"get_peft_model: unknown keyword(s) {unknown}; LoraConfig accepts {sorted(lora_fields)}")
    if target_modules is None:
        target_modules = default_target_modules(model)
    else:
        check_target_modules(model, target_modules)
    peft_kwargs.setdefault("task_type", "CAUSAL_LM")
    config = LoraConfig(
        r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias, target_modules=target_modules, **peft_kwargs
    )

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(random_state)
        with warnings.catch_warnings():  # peft reads the name transformers renamed (is_activation_checkpointing)
            warnings.filterwarnings("ignore", r"`is_gradient_checkpointing` is deprecated", FutureWarning)
            peft_model = peft_get_peft_model(model, config)
    lora_speed.speed_up_lora(peft_model, fused=fused_lora, skip_input_casts=skip_lora_input_casts)
    liger.apply_liger(peft_model, liger_kernel)
    adapters.set_base_model_name(peft_model, model)  # the adapter names what the user loaded, not a cache folder
    # fast_generate and the export methods live on the transformers model too; they save the adapter through its owner
    set_peft_owner(model, peft_model)
    if getattr(model, "vllm_engine", None) is not None:
        model.vllm_engine.check_rank(peft_model)  # now, not at the first rollout
    logger.info(
        "slimrl: LoRA r=%d alpha=%s on %s; trainable %d of %d parameters",
        r,
        lora_alpha,
        target_modules,
        *_parameter_counts(peft_model),
    )
    return checkpointing.apply_checkpointing(peft_model, mode)


def _parameter_counts(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
