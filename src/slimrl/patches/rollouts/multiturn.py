"""GRPO's multi-turn rollouts (`tools=`, `environment_factory`, `rollout_func`) on the patched trainer.

TRL's multi-turn machinery runs unchanged: its tool loop (`_tool_call_loop`) executes the tool calls it parses,
appends each result's tokens to the completion and generates the next turn from `[prompt | completion so far]`;
its `tool_mask` (rollout_func: `env_mask`) marks those result tokens 0 and `_compute_loss` leaves them out of the
loss. slimrl's paths see ordinary `[prompt | completion]` rows, tool results inside the completion, so the lean head
and the shared-prefix forward (each prompt once for its completions) apply as they do to single-turn rows
(tests/patches/rollouts/test_multiturn_parity.py). What this module adds:
1. `_tool_call_loop` runs in a context the patched `_generate_single_turn` reads (`in_tool_turns`): the later turns
   are not held to slimrl's rollout-length check (`prompt + max_completion_length <= max_seq_length`), whose
   "prompt" there is the prompt plus the completion so far. TRL cuts every later turn to what is left of
   `max_completion_length` and drops a tool result that would overrun it or the backend's context, so the rows
   trained on stay within the first turn's check.
"""

from __future__ import annotations

import functools

from ...swaps import RunValue
from ..seams import Patch

_TOOL_TURNS = RunValue("tool_turns", False, "inside TRL's tool loop: the turns after a tool call")


def in_tool_turns() -> bool:
    """Whether the rollout being generated is a turn after a tool call (inside TRL's tool loop)."""
    return _TOOL_TURNS.get()


def make_tool_call_loop(original):
    @functools.wraps(original)
    def _tool_call_loop(self, *args, **kwargs):
        with _TOOL_TURNS.bound(True):
            return original(self, *args, **kwargs)

    return _tool_call_loop


def multiturn_patches(trainer_path: str) -> list[Patch]:
    """GRPOTrainer's tool loop (RLOO has none)."""
    return [
        Patch(
            trainer_path,
            "_tool_call_loop",
            ("self", "prompts", "prompt_ids", "completion_ids", "completions", "logprobs"),
            make_tool_call_loop,
            "turns after a tool call: the completion so far is not counted as prompt in the length check",
        )
    ]
