"""The value function (critic): a second LoRA adapter plus a scalar head on a frozen base, or a user's value model.

Choices:
1. `AdapterCritic`: the adapter "value" (the policy adapter's LoraConfig, or `VALUE_LORA` for a full-model policy)
   on the base the reference already uses, plus `ValueHead`, a float32 `Linear(hidden, 1)` initialised as HF
   initialises a sequence-classification `score` head (normal, std `initializer_range`; bias 0): values start near
   0, and gradients reach the value adapter from the first step (a zero head would block them). The backbone is the
   transformers model's `base_model` (the same attribute the fused log-prob head calls), so no `[B, T, V]` logits.
2. peft's `set_adapter` also freezes every adapter that is not active. `critic.active()` switches with
   `use_adapter`, which sets `requires_grad` back on for every parameter it was given (the policy adapter's and
   the value adapter's), so all of them and the head keep training whichever forward ran last.
3. The caller runs each forward AND its backward inside `critic.active()` (the trainer: value forward+backward,
   then policy forward+backward): under gradient checkpointing the recomputation runs in the backward, and must see
   the adapter the forward used.
4. `ModuleCritic`: a separate value model, TRL's convention (`AutoModelForSequenceClassification` with
   `num_labels=1`: its backbone via `base_model_prefix` and its `score` head), trained in full.
5. `trainable_state()` / `load_trainable_state()`: what a checkpoint needs to restore the critic (adapter weights
   by peft name and the head, or the value model's trainable weights), copied in place so the optimizer's
   references stay valid.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

VALUE_ADAPTER = "value"
VALUE_LORA = {"r": 16, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}


class ValueHead(nn.Module):
    """Scalar value per position from the last hidden state (float32; HF's init of a `score` head)."""

    def __init__(self, hidden_size: int, std: float = 0.02):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1, dtype=torch.float32)
        nn.init.normal_(self.summary.weight, std=std)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden_states.to(self.summary.weight.dtype)).squeeze(-1)


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only (left padding does not shift them), as HF generate does."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


@contextlib.contextmanager
def use_adapter(peft_model, name: str, trainable: list[nn.Parameter]):
    """Make `name` the active adapter for the block, then restore the previous one; `requires_grad` stays on for
    every parameter in `trainable` (peft's set_adapter would freeze the inactive adapters)."""
    previous = peft_model.active_adapter
    if previous != name:
        peft_model.set_adapter(name)
        for p in trainable:
            p.requires_grad_(True)
    try:
        yield
    finally:
        if previous != name:
            peft_model.set_adapter(previous)
            for p in trainable:
                p.requires_grad_(True)


def add_value_adapter(peft_model, lora_config) -> None:
    """Add the value adapter (refusing a name clash) without changing the active adapter."""
    if VALUE_ADAPTER in peft_model.peft_config:
        raise ValueError(
            f"The model already has an adapter named {VALUE_ADAPTER!r}; slimrl's PPO adds its value "
            "adapter under that name. Rename or delete yours, or pass value_model=."
        )
    peft_model.add_adapter(VALUE_ADAPTER, lora_config)
    for name, p in peft_model.named_parameters():
        if f".{VALUE_ADAPTER}." in name and "lora_" in name:
            p.requires_grad_(True)


class AdapterCritic(nn.Module):
    """Values from the "value" adapter of `peft_model` and a `ValueHead`; `trainable` lists the policy's trainable
    parameters too when both adapters share the model, so switching never freezes either."""

    def __init__(self, peft_model, shared_trainable: list[nn.Parameter] | None = None):
        super().__init__()
        text_config = peft_model.get_base_model().config.get_text_config()
        self.head = ValueHead(text_config.hidden_size, getattr(text_config, "initializer_range", 0.02))
        device = next(peft_model.parameters()).device
        self.head.to(device)
        object.__setattr__(self, "peft_model", peft_model)  # not a submodule: the base belongs to the policy/ref
        self.adapter_params = [
            p for n, p in peft_model.named_parameters() if f".{VALUE_ADAPTER}." in n and "lora_" in n
        ]
        self.keep_trainable = list(shared_trainable or []) + self.adapter_params

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.adapter_params + list(self.head.parameters())

    def named_trainable(self) -> dict[str, nn.Parameter]:
        named = {
            f"adapter.{n}": p
            for n, p in self.peft_model.named_parameters()
            if f".{VALUE_ADAPTER}." in n and "lora_" in n
        }
        return {**named, **{f"head.{n}": p for n, p in self.head.named_parameters()}}

    def active(self):
        """Context in which forwards (and their backward) use the value adapter."""
        return use_adapter(self.peft_model, VALUE_ADAPTER, self.keep_trainable)

    def restore_trainable(self) -> None:
        """requires_grad back on for the policy's and the critic's parameters (after peft loaded an adapter)."""
        for p in self.keep_trainable + list(self.head.parameters()):
            p.requires_grad_(True)

    def forward(self, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
        backbone = self.peft_model.get_base_model().base_model
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.head(hidden)


class ModuleCritic(nn.Module):
    """Values from a separate model with TRL's value-model shape (backbone + `score` head)."""

    def __init__(self, value_model):
        super().__init__()
        if not hasattr(value_model, "score") or not hasattr(value_model, "base_model_prefix"):
            raise ValueError(
                "value_model must look like AutoModelForSequenceClassification(num_labels=1) (a backbone "
                f"and a `score` head); got {type(value_model).__name__}. Or leave value_model unset: "
                "slimrl then trains a value adapter on the base model."
            )
        self.value_model = value_model

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.value_model.parameters() if p.requires_grad]

    def named_trainable(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.value_model.named_parameters() if p.requires_grad}

    def active(self):
        return contextlib.nullcontext()

    def restore_trainable(self) -> None:
        pass

    def forward(self, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
        backbone = getattr(self.value_model, self.value_model.base_model_prefix)
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.value_model.score(hidden).squeeze(-1).float()


def trainable_state(critic) -> dict[str, torch.Tensor]:
    """The critic's trainable weights as plain CPU tensors (for safetensors)."""
    return {name: p.detach().cpu().contiguous().clone() for name, p in critic.named_trainable().items()}


@torch.no_grad()
def load_trainable_state(critic, state: dict[str, torch.Tensor]) -> None:
    """Copy saved weights into the critic in place (the optimizer keeps its references); names must match."""
    named = critic.named_trainable()
    missing, unexpected = sorted(set(named) - set(state)), sorted(set(state) - set(named))
    if missing or unexpected:
        raise ValueError(
            f"The saved value-function weights do not fit this critic: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}."
        )
    for name, p in named.items():
        p.copy_(state[name].to(p.device, p.dtype))
