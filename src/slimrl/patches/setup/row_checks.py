"""The rows of a trainer's datasets, checked when the trainer is built (after data_checks.py has found the columns):
a malformed cell fails naming the dataset, the row index and the column, before TRL's preprocessing fails deep inside
a `map` (or, worse, trains on it).

What a cell must be (TRL 1.16's formats):
- `prompt`, `chosen`, `rejected`, `completion`: a string, or a non-empty list of chat messages;
- `messages`: a non-empty list of chat messages; `text` (and SFT's `dataset_text_field`): a string;
- a chat message: a dict with a non-empty string "role" and a "content" (a string, or a list of content parts; an
  assistant turn with "tool_calls" may have none);
- KTO's `label`: a bool (or 0 / 1).
Only the columns of the trainer's accepted forms (data_checks.DATASET_FORMS) are checked, up to SCAN_LIMIT rows
(streaming datasets, whose rows cannot be read ahead, are not checked).
"""

from __future__ import annotations

from .data_checks import DATASET_FORMS
from .trainer_setup import SetupCall

SCAN_LIMIT = 100_000
EITHER, TEXT, MESSAGES, LABEL = "text or messages", "text", "messages", "label"
COLUMN_KINDS = {
    "prompt": EITHER,
    "chosen": EITHER,
    "rejected": EITHER,
    "completion": EITHER,
    "messages": MESSAGES,
    "text": TEXT,
    "label": LABEL,
}
WANTED = {
    EITHER: 'a string or a list of chat messages ({"role": ..., "content": ...})',
    TEXT: "a string",
    MESSAGES: 'a list of chat messages ({"role": ..., "content": ...})',
    LABEL: "True or False",
}
_SHOWN = 60


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _message_problem(message) -> str | None:
    """What is wrong with one chat message, as a predicate ("has no ...", "is ..."), or None."""
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, not a message dict"
    if not isinstance(message.get("role"), str) or not message["role"]:
        return f'has no "role" ({_shown(message)})'
    content = message.get("content")
    if content is None and not message.get("tool_calls"):
        return f'has no "content" ({_shown(message)})'
    if content is not None and not isinstance(content, (str, list)):
        return f'has a "content" that is a {type(content).__name__}'
    return None


def cell_problem(value, kind: str) -> str | None:
    """Why `value` is not a valid cell of a column of `kind` (None: it is)."""
    if value is None:
        return "empty (None)"
    if kind == LABEL:
        return None if isinstance(value, bool) or value in (0, 1) else f"{_shown(value)}, not True or False"
    if isinstance(value, str):
        return None if kind != MESSAGES else "a string, not a list of chat messages"
    if isinstance(value, list) and kind != TEXT:
        if not value:
            return "an empty list of messages"
        for index, message in enumerate(value):
            problem = _message_problem(message)
            if problem is not None:
                return f"a message list whose message {index} {problem}"
        return None
    return f"a {type(value).__name__} ({_shown(value)}), not {WANTED[kind]}"


def columns_to_check(algorithm: str, columns, args) -> dict[str, str]:
    """column -> kind, for the dataset's columns that the trainer's forms read."""
    read = {column for form in DATASET_FORMS[algorithm] for column in form}
    kinds = {column: kind for column, kind in COLUMN_KINDS.items() if column in read and column in columns}
    text_field = getattr(args, "dataset_text_field", None)  # SFT: the user's own text column
    if algorithm == "sft" and text_field in columns:
        kinds[text_field] = TEXT
    return kinds


def check_rows(algorithm: str, trainer: str, role: str, dataset, args, limit: int = SCAN_LIMIT) -> None:
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None or isinstance(columns, dict) or not hasattr(dataset, "__len__"):
        return  # absent, a DatasetDict, or streaming (data_checks.py says the same)
    kinds = columns_to_check(algorithm, columns, args)
    if not kinds or len(dataset) == 0:
        return
    rows = dataset.select(range(min(len(dataset), limit))) if hasattr(dataset, "select") else dataset
    for column, kind in kinds.items():
        for index, value in enumerate(rows[column]):
            problem = cell_problem(value, kind)
            if problem is not None:
                raise ValueError(
                    f"{trainer}: {role} row {index}, column {column!r} is {problem}; a {column!r} cell must be "
                    f"{WANTED[kind]}. Fix the row, or drop such rows with dataset.filter(...)."
                )


def rows_check(algorithm: str):
    """The trainer-time check of `algorithm`'s train and eval datasets, row by row."""

    def check(call: SetupCall) -> None:
        trainer = call.arguments["self"].__class__.__name__
        check_rows(algorithm, trainer, "train_dataset", call.arguments.get("train_dataset"), call.args)
        eval_dataset = call.arguments.get("eval_dataset")
        evals = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
        for name, dataset in evals:
            role = f"eval_dataset{'[' + repr(name) + ']' if name else ''}"
            check_rows(algorithm, trainer, role, dataset, call.args)

    check.__name__ = f"check_{algorithm}_rows"
    return check
