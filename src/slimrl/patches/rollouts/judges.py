"""Pairwise judges for online DPO: TRL 1.16 has neither judges nor `OnlineDPOTrainer(judge=...)`; slimrl turns a judge
into the reward function TRL 1.16's trainer takes.

A judge is any object with `judge(prompts, completions, shuffle_order=True) -> list[int]` (the interface of the
judges older TRL shipped and Unsloth's online DPO examples pass): for each prompt, the index (0 or 1) of the better
of its two completions. `PairwiseJudgeReward(judge)` is a reward function: OnlineDPOTrainer scores all 2B completions
of a step in one call, completion i and i + B sampled from the same prompt i, and takes the one with the higher reward
as chosen (the first on a tie); the judge's preferred completion gets 1.0, the other 0.0, so the judge decides the
pair exactly as older TRL's trainer did with `judge=`. Prompts and completions reach the judge as text: a
conversational prompt as its turns, one `role: content` line each; a completion as its assistant text.

`take_judge`: the patched `OnlineDPOTrainer(judge=...)` (and older TRL's `reward_model=`) map onto `reward_funcs=`
with a notice; both a judge and reward functions: an error naming both.
"""

from __future__ import annotations

from ...notices import notice
from ..compat import short, take_alias


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return str(value.get("content", ""))
    if isinstance(value, (list, tuple)):  # conversational: every turn, role named
        turns = (f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value)
        return "\n".join(turns)
    return str(value)


def _completion_text(value) -> str:
    if isinstance(value, (list, tuple)):  # TRL hands a conversational completion as [{"role": "assistant", ...}]
        return "".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
    return _text(value)


class PairwiseJudgeReward:
    """A pairwise judge as an OnlineDPOTrainer reward: 1.0 for the completion it prefers, 0.0 for the other."""

    def __init__(self, judge):
        if not callable(getattr(judge, "judge", None)):
            raise TypeError(
                f"judge={short(judge)} has no judge(prompts, completions) method: a pairwise judge returns, for "
                "each prompt, the index (0 or 1) of the better of its two completions."
            )
        self.judge = judge
        self.__name__ = type(judge).__name__  # TRL names the reward's metrics after it

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        n = len(prompts)
        half = n // 2
        if n % 2 or list(prompts[:half]) != list(prompts[half:]):
            raise ValueError(
                f"{self.__name__}: a pairwise judge scores the two completions of each prompt, laid out as "
                "OnlineDPOTrainer does (completion i and i + B from prompt i); these prompts are not in pairs. "
                "Use the judge with OnlineDPOTrainer only."
            )
        pairs = [[_completion_text(a), _completion_text(b)] for a, b in zip(completions[:half], completions[half:])]
        ranks = list(self.judge.judge([_text(p) for p in prompts[:half]], pairs))
        if len(ranks) != half:
            raise ValueError(f"{self.__name__}.judge returned {len(ranks)} ranks for {half} prompts.")
        rewards = [0.0] * n
        for i, rank in enumerate(ranks):
            if rank not in (0, 1):
                raise ValueError(
                    f"{self.__name__}.judge returned {rank!r} for prompt {i} ({_text(prompts[i])[:200]!r}): a "
                    "pairwise judge must return 0 (first completion better) or 1 (second); -1 means it failed."
                )
            rewards[i if rank == 0 else half + i] = 1.0
        return rewards


def take_judge(kwargs: dict, owner: str) -> None:
    """`reward_model=` as `reward_funcs=`; `judge=` as `reward_funcs=PairwiseJudgeReward(judge)`, with notices."""
    if "reward_funcs" in kwargs and kwargs["reward_funcs"] is None:  # TRL's default, written out: not a choice
        del kwargs["reward_funcs"]
    take_alias(kwargs, "reward_model", "reward_funcs", owner)
    if "judge" not in kwargs:
        return
    judge = kwargs.pop("judge")
    if kwargs.get("reward_funcs") is not None:
        raise ValueError(
            f"{owner} got both judge={short(judge)} and reward_funcs={short(kwargs['reward_funcs'])}: pass one of "
            "them (a judge is used as reward_funcs=slimrl.patches.rollouts.judges.PairwiseJudgeReward(judge))."
        )
    kwargs["reward_funcs"] = PairwiseJudgeReward(judge)
    notice(
        f"{owner}(judge=...) is older TRL's argument; TRL 1.16 takes reward functions: using "
        f"reward_funcs=PairwiseJudgeReward({type(judge).__name__}) (1 for the completion it prefers, 0 for the other)."
    )
