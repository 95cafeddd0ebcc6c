"""The one value set for how the training weights reach vLLM, shared by both knobs that choose it.

  "lora"    the LoRA adapter is handed over (in-process engine: a LoRARequest; vLLM server: its LoRA endpoints)
  "merged"  the adapter is merged and the weights themselves are handed over (in-process: reloaded in place;
            server: TRL's NCCL weight transfer)
  "auto"    each knob's own default (FastLanguageModel's `vllm_weight_sync`: slimrl.generation.vllm_engine;
            the config's `vllm_server_sync`: slimrl.patches.rollouts.vllm_server)

The server knob's former spellings "adapter" and "weights" are still accepted, with a one-line notice naming the
new spelling.
"""

from __future__ import annotations

from ..notices import notice

SYNC_MODES = ("auto", "lora", "merged")
FORMER_SPELLINGS = {"adapter": "lora", "weights": "merged"}


def normalize_sync_mode(value, knob: str) -> str:
    """`value` in the one spelling ("auto" | "lora" | "merged"); `knob` names the setting in messages."""
    if value in FORMER_SPELLINGS:
        notice(f"{knob}={value!r} is now spelled {FORMER_SPELLINGS[value]!r}; using {FORMER_SPELLINGS[value]!r}")
        return FORMER_SPELLINGS[value]
    if value not in SYNC_MODES:
        raise ValueError(f"{knob}={value!r}: choose one of {', '.join(map(repr, SYNC_MODES))}.")
    return value
