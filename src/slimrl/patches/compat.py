"""What older TRL and Unsloth scripts write that TRL 1.16 spells differently: accepted with a notice, or refused
saying what replaced it. One table per kind; the set-up (trainer_setup.py) and the registry apply them.

1. Trainer arguments: `tokenizer=` is the older name of `processing_class=` (every trainer); slimrl's PPOTrainer
   also takes `config=`, TRL's PPO name of `args=`.
2. Config fields TRL renamed, taken under the new name with a one-line notice naming both (given both, different:
   an error): `max_new_tokens` (generation's name) for GRPO/RLOO's `max_completion_length`; `max_seq_length` for the
   offline trainers' `max_length` (SFTConfig renamed it in TRL 0.20).
3. Config fields TRL removed: an error saying what replaced them (silently dropping a length limit would change
   what the user trains on). `max_prompt_length` is kept with its old meaning where it had one for the trainer
   (GRPO/RLOO/DPO/ORPO/CPO: prompt_limit.py), refused for KTO/SFT/reward.
4. transformers 4.x's `warmup_ratio` (every patched config): transformers 5 removed it and reads a `warmup_steps`
   below 1 as the same fraction of the training steps (`ceil(steps x fraction)` in both), so the value moves there
   with a notice. 1.0 (warm up over the whole run) has no such spelling and is refused, naming what to write.
5. Trainer keywords TRL 0.x took on the trainer and later moved to the config (`DPOTrainer(beta=..., max_length=...,
   max_prompt_length=...)`): set on the config with a notice; a different value the user set on the config raises.
6. Algorithms TRL no longer ships (or slimrl does not patch): an error naming the nearest one slimrl supports.
"""

from __future__ import annotations

import dataclasses
import inspect

from ..notices import notice
from ..state import config_state
from ..swaps import adjust_default

ARGUMENT_ALIASES = (("tokenizer", "processing_class"),)
PPO_ARGUMENT_ALIASES = (("config", "args"), *ARGUMENT_ALIASES)

ONLINE_RENAMED = (("max_new_tokens", "max_completion_length"),)
ONLINE_REMOVED = ()
OFFLINE_RENAMED = (("max_seq_length", "max_length"),)
PAIRED_REMOVED = (  # DPO, ORPO, CPO: max_prompt_length keeps its meaning there (prompt_limit.py)
    (
        "max_target_length",
        "Prompt and completion are truncated together by max_length. Remove the argument and set max_length.",
    ),
)
OFFLINE_REMOVED = (
    (
        "max_prompt_length",
        "Prompt and completion are truncated together by max_length (SFT: truncation_mode chooses which end is "
        "kept). Remove the argument and set max_length.",
    ),
    *PAIRED_REMOVED,
)
WARMUP_RATIO, WARMUP_STEPS = "warmup_ratio", "warmup_steps"
# Algorithms PatchFastRL refuses, with the nearest one it patches: TRL removed PRM, XPO, BCO and Nash-MD after 1.12
REMOVED_ALGORITHMS = {
    "prm": "TRL removed its PRM (process reward model) trainer; train a step-level scorer as a reward model "
    "(PatchFastRL('reward'))",
    "xpo": "TRL removed XPO; the nearest supported algorithm is 'dpo' (offline) or 'grpo' (online)",
    "bco": "TRL removed BCO; the nearest supported algorithm is 'kto' (unpaired desirable/undesirable data)",
    "nash_md": "TRL removed Nash-MD; the nearest supported algorithm is 'grpo' (online) or 'dpo' (offline)",
}


def short(value) -> str:
    text = repr(value) if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def take_alias(kwargs: dict, old: str, new: str, owner: str) -> None:
    """`kwargs[old]` moved to `kwargs[new]` with a notice; both given and different: ValueError naming both."""
    if old not in kwargs:
        return
    value = kwargs.pop(old)
    if new in kwargs and kwargs[new] is not value and kwargs[new] != value:
        raise ValueError(
            f"{owner} got both {old}={short(value)} and {new}={short(kwargs[new])}: {old} is the "
            f"older name of {new}; pass only {new}."
        )
    kwargs[new] = value
    notice(f"{owner}({old}=...) is TRL 1.16's {new}=...; using it as {new}={short(value)}.")


def take_warmup_ratio(owner: str, kwargs: dict) -> None:
    """transformers 4.x's `warmup_ratio` as transformers 5's fractional `warmup_steps` (see the module's point 4)."""
    ratio = kwargs.pop(WARMUP_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ValueError(f"{owner}(warmup_ratio={short(ratio)}): a fraction of the training steps in [0, 1] is needed.")
    if ratio == 1:
        raise ValueError(
            f"{owner}(warmup_ratio=1): transformers 5 removed warmup_ratio, and warmup_steps reads values from 1 up as "
            "a number of steps, so warming up over the whole run has no fractional spelling. Set warmup_steps to "
            "the number of training steps (e.g. max_steps)."
        )
    if WARMUP_STEPS in kwargs and kwargs[WARMUP_STEPS] != ratio:
        raise ValueError(
            f"{owner} got both warmup_ratio={short(ratio)} and warmup_steps={short(kwargs[WARMUP_STEPS])}: "
            "transformers 5 spells the ratio as warmup_steps below 1; pass only warmup_steps."
        )
    kwargs[WARMUP_STEPS] = float(ratio)
    notice(
        f"{owner}(warmup_ratio={short(ratio)}) is transformers 5's warmup_steps={short(float(ratio))} (a value below "
        "1 is the fraction of the training steps); using it."
    )


def adapt_config_kwargs(config_cls, kwargs: dict, renamed, removed) -> None:
    """Renamed fields under TRL 1.16's name (with a notice), removed ones refused saying what replaced them."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    if WARMUP_RATIO in kwargs and WARMUP_RATIO not in fields:
        take_warmup_ratio(config_cls.__name__, kwargs)
    for old, new in renamed:
        if old in kwargs and old not in fields and new in fields:
            take_alias(kwargs, old, new, config_cls.__name__)
    for name, replacement in removed:
        if name in kwargs and name not in fields:
            raise TypeError(f"{config_cls.__name__}({name}=...): TRL 1.16 removed {name}. {replacement}")


def _config_object(signature: inspect.Signature, args: tuple, kwargs: dict):
    """The `args=` config of a trainer call (by keyword or position; `args` excludes `self`)."""
    if "args" in kwargs:
        return kwargs["args"]
    position = list(signature.parameters).index("args") - 1 if "args" in signature.parameters else len(args)
    return args[position] if position < len(args) else None


def move_trainer_kwargs(signature: inspect.Signature, args: tuple, kwargs: dict, owner: str, family) -> None:
    """Keywords TRL 0.x took on the trainer that are now fields of its config, set on the config (module point 5);
    `family` (trainer_setup.Family): its renamed fields are taken under the new name, its removed ones refused."""
    movable = [name for name in kwargs if name not in signature.parameters]
    config = _config_object(signature, args, kwargs) if movable else None
    if config is None or not dataclasses.is_dataclass(config):
        return  # nothing to move, or no config to move it to: TRL names the unexpected keyword itself
    config_cls = type(config)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for name in movable:
        target = dict(family.renamed_fields).get(name, name)
        if target not in fields and not hasattr(config_cls, target):
            if name in dict(family.removed_fields):
                raise TypeError(f"{owner}({name}=...): TRL 1.16 removed {name}. {dict(family.removed_fields)[name]}")
            continue
        value, current = kwargs.pop(name), getattr(config, target)
        why = f"{owner}({name}=...) taken as the config's {target}"
        if current is not value and current != value and not adjust_default(config, target, value, why):
            raise ValueError(
                f"{owner}({name}={short(value)}) and {config_cls.__name__}({target}={short(current)}) disagree: "
                f"TRL 1.16 reads {target} from the config only; set it there once."
            )
        state = config_state(config, create=False)
        if state is not None and state.user_fields is not None:  # the user's choice now, not TRL's default
            state.user_fields = state.user_fields | {target}
        notice(f"{owner}({name}=...) is a {config_cls.__name__} field in TRL 1.16; set {target}={short(value)} there.")
