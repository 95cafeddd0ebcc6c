"""Pairwise judges for online DPO, in the interface of the judges older TRL shipped: `judge(prompts, completions,
shuffle_order=True) -> list[int]`, for each prompt the index (0 or 1) of the better of its two completions.

`ArithmeticJudge` judges the built-in arithmetic task offline (no model, no network): it reads the question of each
prompt (the last "What is A op B?" in it) and prefers the completion whose single `<answer>N</answer>` holds the
right result, then a well-formed answer over a malformed one; on a tie the first completion wins (as TRL's
OnlineDPOTrainer keeps the first of two equal rewards). `load_judge(spec)` resolves the CLI's `--judge`: the
built-in name or a class given as `module.Class` / `path/to/file.py:Class`, built with no arguments.
"""

from __future__ import annotations

import re

from .rewards import completion_text, parse_answer

_QUESTION = re.compile(r"What is (\d{1,9}) ([+-]) (\d{1,9})\?")


def question_result(prompt: str) -> int | None:
    """The result of the last arithmetic question in `prompt`, or None when it holds none."""
    found = _QUESTION.findall(prompt or "")
    if not found:
        return None
    a, op, b = found[-1]
    return int(a) + int(b) if op == "+" else int(a) - int(b)


class ArithmeticJudge:
    """Prefers the right answer, then a well-formed one; the first completion on a tie."""

    def _score(self, expected: int | None, completion) -> tuple[int, int]:
        answer = parse_answer(completion_text(completion))
        return (int(answer is not None and answer == expected), int(answer is not None))

    def judge(self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True) -> list[int]:
        ranks = []
        for prompt, (first, second) in zip(prompts, completions):
            expected = question_result(prompt)
            ranks.append(0 if self._score(expected, first) >= self._score(expected, second) else 1)
        return ranks


BUILTIN_JUDGES = {"arithmetic": ArithmeticJudge}


def load_judge(spec: str):
    """A judge instance from the built-in name or `module.Class` / `path/to/file.py:Class`."""
    if spec in BUILTIN_JUDGES:
        return BUILTIN_JUDGES[spec]()
    from .custom import TaskError, load_reward_func

    try:
        judge_class = load_reward_func(spec)
    except TaskError as exc:
        raise TaskError(f"--judge {spec!r}: {exc} (built-in judges: {', '.join(BUILTIN_JUDGES)})") from exc
    judge = judge_class() if isinstance(judge_class, type) else judge_class
    if not callable(getattr(judge, "judge", None)):
        raise TaskError(f"--judge {spec!r} has no judge(prompts, completions) method")
    return judge
