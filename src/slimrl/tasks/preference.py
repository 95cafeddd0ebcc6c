"""Built-in preference data for `slimrl dpo | orpo | kto`, derived from the arithmetic task, and user preference sets.

Choices made:
- Paired rows (DPO, ORPO, CPO): the arithmetic prompt (same worked examples and held-out split as the GRPO task),
  `chosen` = the correct `<answer>N</answer>`, `rejected` = a wrong answer in the same format. Wrong answers are the
  kind SmolLM2-135M actually gives: off by one to three, or the number of a worked example, drawn from the same
  seeded generator (deterministic), never equal to the right answer and never negative.
- Unpaired rows (KTO): each prompt contributes one desirable row (`completion` = correct, `label` True) and one
  undesirable row (wrong, `label` False), so the desirable/undesirable ratio is 1 and TRL's default weights apply.
- Completions are conversational (`[{"role": "assistant", ...}]`), the format TRL's preference trainers apply the
  chat template to; the eval split keeps the `answer` column so held-out greedy accuracy works as for GRPO.
"""

from __future__ import annotations

import random

from ..families import PAIRED, UNPAIRED
from .arithmetic import DEFAULTS, arithmetic_splits, parse_answer_from_prompt_example


def _wrong_answer(rng: random.Random, answer: int, example_answers: list[int]) -> int:
    candidates = [a for a in example_answers if a != answer]
    if candidates and rng.random() < 0.3:
        return rng.choice(candidates)  # the model's habit of copying a worked example's answer
    while True:
        wrong = answer + rng.choice([-3, -2, -1, 1, 2, 3])
        if wrong >= 0:
            return wrong


def _message(n: int) -> list[dict]:
    return [{"role": "assistant", "content": f"<answer>{n}</answer>"}]


def preference_rows(rows: list[dict], seed: int, paired: bool) -> list[dict]:
    rng = random.Random(seed + 1)  # its own stream: the prompts are exactly the GRPO task's
    out = []
    for row in rows:
        answer = int(row["answer"])
        examples = [parse_answer_from_prompt_example(m) for m in row["prompt"] if m["role"] == "assistant"]
        wrong = _wrong_answer(rng, answer, [e for e in examples if e is not None])
        if paired:
            out.append(
                {
                    "prompt": row["prompt"],
                    "chosen": _message(answer),
                    "rejected": _message(wrong),
                    "answer": row["answer"],
                }
            )
        else:
            out.append(
                {"prompt": row["prompt"], "completion": _message(answer), "label": True, "answer": row["answer"]}
            )
            out.append(
                {"prompt": row["prompt"], "completion": _message(wrong), "label": False, "answer": row["answer"]}
            )
    return out


def arithmetic_preference_splits(
    algorithm: str, num_train_samples: int = 1000, num_eval_samples: int = 64, seed: int = 42, **options
):
    """(train, eval) Datasets for `algorithm`: paired chosen/rejected rows, or KTO's unpaired labelled rows.

    The eval split is the GRPO task's held-out prompts (prompt + answer), for the greedy accuracy before/after.
    """
    from datasets import Dataset

    if algorithm not in PAIRED + UNPAIRED:
        raise ValueError(f"no built-in preference data for {algorithm!r}; known: {', '.join(PAIRED + UNPAIRED)}")
    options = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    train, evaluation = arithmetic_splits(num_train_samples, num_eval_samples, seed, **options)
    rows = preference_rows(train.to_list(), seed, paired=algorithm in PAIRED)
    return Dataset.from_list(rows), evaluation


def preference_dataset(
    algorithm: str,
    dataset_name: str,
    dataset_config: str | None = None,
    dataset_train_split: str = "train",
    prompt_column: str = "prompt",
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
    completion_column: str = "completion",
    label_column: str = "label",
    num_train_samples: int | None = None,
):
    """A user's preference set, columns renamed to what TRL reads (prompt/chosen/rejected, or prompt/completion/label).

    Raises `TaskError` naming the missing column and the flag that sets it, before any model is loaded.
    """
    from .custom import TaskError, load_splits

    splits = load_splits(dataset_name, dataset_config)
    if dataset_train_split not in splits:
        raise TaskError(f"Dataset {dataset_name!r} has no split {dataset_train_split!r} (splits: {list(splits)})")
    train = splits[dataset_train_split]
    if algorithm in PAIRED:
        wanted = {
            "prompt": ("--prompt_column", prompt_column),
            "chosen": ("--chosen_column", chosen_column),
            "rejected": ("--rejected_column", rejected_column),
        }
    else:
        wanted = {
            "prompt": ("--prompt_column", prompt_column),
            "completion": ("--completion_column", completion_column),
            "label": ("--label_column", label_column),
        }
    for target, (flag, column) in wanted.items():
        if column not in train.column_names:
            if target == "prompt" and all(c in train.column_names for t, (_, c) in wanted.items() if t != "prompt"):
                continue  # TRL extracts an implicit prompt from chosen/rejected conversations
            raise TaskError(
                f"Dataset {dataset_name!r} has no column {column!r} for {algorithm} (columns: "
                f"{train.column_names}); pass {flag}"
            )
        if column != target:
            if target in train.column_names:
                train = train.remove_columns(target)
            train = train.rename_column(column, target)
    if num_train_samples is not None:
        train = train.select(range(min(num_train_samples, len(train))))
    return train
