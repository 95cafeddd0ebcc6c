"""The patch list of TRL's paired-preference trainers that never hold `[2B, T, V]` logits (experimental ORPO and
CPO): the lean `concatenated_forward` (scoring/concatenated_forward.py), the prompt cut, the offline set-up."""

from __future__ import annotations

from ..scoring.concatenated_forward import FORWARD_PARAMS, TRAINER_PARAMS, PairedForward, concatenated_forward_maker
from ..seams import Patch, alias_patches
from ..setup import prompt_limit
from .offline import SHARED_PREFIX_OFFLINE, offline_patches


def paired_patches(algorithm: str, forward: PairedForward) -> list:
    """ORPO's or CPO's PATCHES: the lean `concatenated_forward`, `tokenize_row`'s prompt cut, the set-up shared with
    DPO/KTO and the `trl.<Name>Config` / `trl.<Name>Trainer` aliases of `trl.experimental.<algorithm>`."""
    package = f"trl.experimental.{algorithm}"
    config = forward.name.replace("Trainer", "Config")
    trainer = f"{package}.{algorithm}_trainer.{forward.name}"
    return [
        Patch(
            trainer,
            "concatenated_forward",
            FORWARD_PARAMS,
            concatenated_forward_maker(forward),
            "chunked log-probs / NLL / mean-logits from the hidden states; no [2B, T, V] logits",
        ),
        Patch(
            trainer,
            "tokenize_row",
            ("self", "feature", "model"),
            prompt_limit.make_tokenize_row,
            "max_prompt_length: TRL 0.2x's prompt-then-answer cut",
        ),
        *offline_patches(
            algorithm, trainer, f"{package}.{algorithm}_config.{config}", TRAINER_PARAMS, family=SHARED_PREFIX_OFFLINE
        ),
        *alias_patches(package, (config, forward.name)),
    ]
