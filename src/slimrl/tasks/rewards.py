"""Reward functions for slimrl's built-in tasks, in TRL's signature `f(completions, **kwargs) -> list[float]`.

Choices made:
- A completion may be a plain string (standard prompts), a list of message dicts (conversational prompts: TRL passes
  `[{"role": "assistant", "content": ...}]`), a single message dict, or junk (None, numbers): every shape is turned into
  text by `completion_text`, and anything unusable scores 0.0. A reward function never raises on a completion.
- The answer format is `<answer>N</answer>` with an ASCII integer N. Exactly one answer tag pair must be present:
  completions that hedge with several tags get 0 for format AND correctness (otherwise "<answer>1</answer>
  <answer>2</answer>..." would farm the correctness reward).
- Parsing uses simple, non-backtracking patterns and only looks at the first `MAX_PARSE_CHARS` characters, so a
  pathological multi-megabyte completion costs linear time.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_PARSE_CHARS = 20_000
_TAG_PAIR = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")  # ASCII digits only: unicode digits ("٣") are not the requested format


def completion_text(completion: Any) -> str:
    """The assistant text of one completion, whatever shape TRL (or a user) hands over; "" when there is none."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content")
        return content if isinstance(content, str) else ""
    if isinstance(completion, (list, tuple)):
        # Conversational: concatenate assistant turns (TRL gives exactly one; tool loops can give more)
        parts = [
            completion_text(m) for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ]
        return "".join(parts)
    return ""


def parse_answer(text: str) -> int | None:
    """The integer inside the single `<answer>...</answer>` pair of `text`; None when absent, repeated or not an
    integer."""
    if not isinstance(text, str):
        return None
    matches = _TAG_PAIR.findall(text[:MAX_PARSE_CHARS])
    if len(matches) != 1:
        return None
    inner = matches[0].strip()
    if not _INTEGER.fullmatch(inner):
        return None
    return int(inner)


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 when the completion holds exactly one `<answer>INTEGER</answer>` pair, else 0.0."""
    return [1.0 if parse_answer(completion_text(c)) is not None else 0.0 for c in completions]


def _as_int(value: Any) -> int | None:
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, (int,)):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            return int(value.strip())
    except (ValueError, OverflowError):
        return None
    return None


def correctness_reward(completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """1.0 when the parsed answer equals the row's `answer` column, else 0.0 (malformed, missing or repeated → 0.0)."""
    if answer is None:
        raise ValueError("correctness_reward needs the dataset's 'answer' column (TRL passes it as the `answer` kwarg)")
    rewards = []
    for completion, expected in zip(completions, answer):
        predicted = parse_answer(completion_text(completion))
        target = _as_int(expected)
        rewards.append(1.0 if predicted is not None and target is not None and predicted == target else 0.0)
    return rewards


def closeness_reward(completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """exp(-|predicted - answer|): 1.0 when exact, 0.37 one off, 0.14 two off; 0.0 when malformed or missing.

    A dense companion to `correctness_reward`: a 135M model is exactly right too rarely for most GRPO groups to hold
    a correct answer, but nearly always some completions are closer than others, so the group has a signal.
    """
    if answer is None:
        raise ValueError("closeness_reward needs the dataset's 'answer' column (TRL passes it as the `answer` kwarg)")
    rewards = []
    for completion, expected in zip(completions, answer):
        predicted, target = parse_answer(completion_text(completion)), _as_int(expected)
        if predicted is None or target is None:
            rewards.append(0.0)
        else:
            rewards.append(math.exp(-min(abs(predicted - target), 50)))
    return rewards
