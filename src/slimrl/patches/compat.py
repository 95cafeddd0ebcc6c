"""What older TRL and Unsloth scripts write that TRL 1.16 spells differently: accepted with a notice, or refused
saying what replaced it. One table per kind; the set-up (trainer_setup.py) and the registry apply them.

1. Trainer arguments: `tokenizer=` is the older name of `processing_class=` (every trainer); slimrl's PPOTrainer
   also takes `config=`, TRL's PPO name of `args=`.
2. Config fields TRL renamed, taken under the new name with a one-line notice naming both (given both, different:
   an error): `max_new_tokens` (generation's name) for GRPO/RLOO's `max_completion_length`; `max_seq_length` for the
   offline trainers' `max_length` (SFTConfig renamed it in TRL 0.20).
3. Config fields TRL removed: an error saying what replaced them (silently dropping a length limit would change
   what the user trains on).
4. Algorithms TRL no longer ships (or slimrl does not patch): an error naming the nearest one slimrl supports.
"""

from __future__ import annotations

import dataclasses

from ..notices import notice

ARGUMENT_ALIASES = (("tokenizer", "processing_class"),)
PPO_ARGUMENT_ALIASES = (("config", "args"), *ARGUMENT_ALIASES)

ONLINE_RENAMED = (("max_new_tokens", "max_completion_length"),)
ONLINE_REMOVED = (
    (
        "max_prompt_length",
        "GRPO/RLOO no longer truncate prompts (cutting a chat template mid-way changed what the "
        "model saw). Remove the argument; slimrl checks the longest prompt plus "
        "max_completion_length against the model's max_seq_length when the trainer is built.",
    ),
)
OFFLINE_RENAMED = (("max_seq_length", "max_length"),)
OFFLINE_REMOVED = (
    (
        "max_prompt_length",
        "Prompt and completion are truncated together by max_length (DPO and SFT: truncation_mode "
        "chooses which end is kept). Remove the argument and set max_length.",
    ),
    (
        "max_target_length",
        "Prompt and completion are truncated together by max_length. Remove the argument and set max_length.",
    ),
)
# Names PatchFastRL refuses, with the nearest algorithm it supports: trainers TRL removed (PRM, XPO, BCO, Nash-MD after
# 1.12), and GKD, which TRL 1.16 still ships under trl.experimental.gkd but slimrl does not patch yet
REMOVED_ALGORITHMS = {
    "prm": "TRL removed its PRM (process reward model) trainer; train a step-level scorer as a reward model "
    "(PatchFastRL('reward'))",
    "xpo": "TRL removed XPO; the nearest supported algorithm is 'dpo' (offline) or 'grpo' (online)",
    "bco": "TRL removed BCO; the nearest supported algorithm is 'kto' (unpaired desirable/undesirable data)",
    "nash_md": "TRL removed Nash-MD; the nearest supported algorithm is 'grpo' (online) or 'dpo' (offline)",
    "gkd": "TRL 1.16 has GKD under trl.experimental.gkd, which slimrl does not patch yet (stock TRL runs it "
    "unpatched); the nearest supported algorithm is 'sft'",
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


def adapt_config_kwargs(config_cls, kwargs: dict, renamed, removed) -> None:
    """Renamed fields under TRL 1.16's name (with a notice), removed ones refused saying what replaced them."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for old, new in renamed:
        if old in kwargs and old not in fields and new in fields:
            take_alias(kwargs, old, new, config_cls.__name__)
    for name, replacement in removed:
        if name in kwargs and name not in fields:
            raise TypeError(f"{config_cls.__name__}({name}=...): TRL 1.16 removed {name}. {replacement}")
