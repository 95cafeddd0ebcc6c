"""The models one PPO run uses, built on as few model bodies as possible, and their no-[B, T, V] forwards.

Choices:
1. LoRA policy (a PeftModel, or a model plus `peft_config`): the reference is the same model with its adapters
   disabled (`disable_adapter()`, no copy), and the critic is a second adapter "value" plus a scalar head on the
   same base (value.py). One model body in memory.
2. Full-model policy: the reference is a frozen copy of the policy at the start (as TRL's PPO made one), and the
   critic's value adapter sits on that frozen copy (disabled for reference forwards): two bodies, not TRL's four.
   A `ref_model` / `value_model` the user passes is used as given (a user `ref_model` under a full-model policy gets
   the value adapter injected, logged).
3. Every log-prob comes from slimrl's lean head (`slimrl.ops.logprob.add_fused_lm_head`: `labels=...,
   fused_lm_head=True`), installed on the policy's transformers model (log-probs + entropy) and on a separate
   reference (log-probs) with the sampling temperature. Dropout is switched off in every model (TRL's PPO did the
   same: with dropout the first epoch's ratio would not be 1).
4. Reward sources: `reward_model` (TRL's PPO name) and `reward_funcs` (GRPO's) are one list; a module among them is
   a sequence-classification reward model, frozen and in eval mode.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..state import transformers_model
from .value import VALUE_ADAPTER, VALUE_LORA, AdapterCritic, ModuleCritic, add_value_adapter, position_ids_of

logger = logging.getLogger("slimrl")

_NOT_COPIED = ("forward", "vllm_engine", "fast_generate")  # instance attributes a frozen copy must not share


@dataclass
class PPOModels:
    policy: nn.Module
    reference: nn.Module  # the module the reference forward calls
    reference_adapters_off: bool  # True: call `reference` inside `disable_adapter()`
    critic: nn.Module
    reward_funcs: list = field(default_factory=list)

    def reference_context(self):
        return self.reference.disable_adapter() if self.reference_adapters_off else contextlib.nullcontext()

    def extra_trainable(self) -> list[nn.Parameter]:
        """Trainable parameters that live outside the policy module (the optimizer gets them as well)."""
        inside = {id(p) for p in self.policy.parameters()}
        return [p for p in self.critic.trainable_parameters() if id(p) not in inside]


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def frozen_copy(model) -> nn.Module:
    """A deep copy with frozen weights (its own forward: an instance-level head installed on `model` stays there)."""
    held = {name: model.__dict__.pop(name) for name in _NOT_COPIED if name in model.__dict__}
    try:
        copied = copy.deepcopy(model)
    finally:
        model.__dict__.update(held)
    copied.requires_grad_(False)
    return copied.eval()


def reward_sources(reward_model, reward_funcs) -> list:
    """One list from TRL PPO's `reward_model` and GRPO's `reward_funcs` (each: a module, a callable or a list)."""
    if reward_model is not None and reward_funcs is not None:
        raise ValueError("reward_model= and reward_funcs= were both given: pass all reward sources in one of them.")
    given = reward_model if reward_model is not None else reward_funcs
    sources = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
    for source in sources:
        if not isinstance(source, nn.Module) and not callable(source):
            raise TypeError(
                f"A reward source must be a reward model (nn.Module) or a function f(prompts, "
                f"completions, completion_ids, **kwargs) -> list[float]; got {type(source).__name__}."
            )
        if isinstance(source, nn.Module):
            source.requires_grad_(False)
            source.eval()
    return sources


def policy_with_peft(model, peft_config):
    if peft_config is None:
        return model
    if is_peft(model):
        raise ValueError(
            "peft_config= was given but the model already has a LoRA adapter (a PeftModel): pass "
            "either a plain model with peft_config, or the PeftModel without it."
        )
    from peft import get_peft_model

    return get_peft_model(model, peft_config)


def build_models(model, ref_model, value_model, sources: list, peft_config, temperature: float) -> PPOModels:
    from trl.trainer.utils import disable_dropout_in_model

    policy = policy_with_peft(model, peft_config)
    if ref_model is not None and ref_model is policy:
        raise ValueError(
            "ref_model is the policy model itself: pass ref_model=None (LoRA: the adapter-disabled base "
            "is the reference; full model: slimrl makes a frozen copy)."
        )
    check_plain_head(policy)
    if is_peft(policy):
        reference, adapters_off = (ref_model, False) if ref_model is not None else (policy, True)
        shared = [p for p in policy.parameters() if p.requires_grad]
        if value_model is None:
            add_value_adapter(policy, value_lora_config(policy.peft_config[policy.active_adapter]))
        critic = ModuleCritic(value_model) if value_model is not None else AdapterCritic(policy, shared)
    else:
        reference = ref_model.requires_grad_(False).eval() if ref_model is not None else frozen_copy(policy)
        reference, adapters_off, critic = critic_on_reference(reference, value_model, ref_model is not None)
    for module in (policy, reference, value_model, *[s for s in sources if isinstance(s, nn.Module)]):
        if module is not None:
            disable_dropout_in_model(module)
    install_heads(policy, None if reference is policy else reference, temperature)
    return PPOModels(policy, reference, adapters_off, critic, sources)


def value_lora_config(policy_config):
    """The policy adapter's LoraConfig for the value adapter: trainable, and without `modules_to_save` (the critic
    never uses the output layer; a saved copy of it would cost a V x H matrix)."""
    config = copy.deepcopy(policy_config)
    config.inference_mode = False
    config.modules_to_save = None
    return config


def check_plain_head(policy) -> None:
    """The lean head reads `lm_head.weight` itself: a LoRA (or saved copy) on the output layer would never train
    and generation would sample from a different model than the one scored (TRL's GRPO refuses it too)."""
    head = transformers_model(policy).get_output_embeddings()
    if type(head) is not nn.Linear:
        raise ValueError(
            f"The policy's output layer is a {type(head).__name__}, not a plain nn.Linear (a LoRA or "
            "modules_to_save on lm_head?): slimrl's PPO scores tokens from lm_head.weight directly. "
            "Leave lm_head out of the LoRA target_modules / modules_to_save."
        )


def critic_on_reference(reference, value_model, user_reference: bool):
    """(reference module, adapters_off, critic) for a full-model policy."""
    if value_model is not None:
        return reference, False, ModuleCritic(value_model)
    from peft import LoraConfig, get_peft_model

    if user_reference:
        logger.info(
            "slimrl: the value adapter %r is added to the ref_model you passed (its weights stay frozen)", VALUE_ADAPTER
        )
    wrapped = get_peft_model(reference, LoraConfig(**VALUE_LORA), adapter_name=VALUE_ADAPTER)
    return wrapped, True, AdapterCritic(wrapped)


def install_heads(policy, reference, temperature: float) -> None:
    from ..ops.logprob import add_fused_lm_head

    add_fused_lm_head(transformers_model(policy), temperature=temperature, outputs=("log_probs", "entropy"))
    if reference is not None:
        add_fused_lm_head(transformers_model(reference), temperature=temperature, outputs=("log_probs",))


def response_logprobs(model, input_ids, attention_mask, context_length: int, entropy: bool = False):
    """(log-probs, entropy or None), `[B, C]` over the response columns, from the lean head (no [B, T, V])."""
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :context_length] = -100
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_of(attention_mask),
        labels=labels,
        fused_lm_head=True,
    )
    logprobs = out.log_probs[:, context_length - 1 :]
    ent = out.entropy[:, context_length - 1 :] if entropy and out.entropy is not None else None
    return logprobs, ent


def response_values(critic, input_ids, attention_mask, context_length: int) -> torch.Tensor:
    """`[B, C]`: the value of the state before each response token."""
    values = critic(input_ids, attention_mask, position_ids_of(attention_mask))
    return values[:, context_length - 1 : -1]
