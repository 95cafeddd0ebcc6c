"""The datasets a trainer is given, checked when it is built: a missing column or an empty dataset fails at once,
naming the trainer, what it needs and what the dataset has (TRL would fail later, deep inside preprocessing or the
first step, with a bare `KeyError: 'prompt'`).

The check never refuses what the stock trainer trains on. Each trainer accepts the column sets its TRL 1.16 trainer
prepares (`DATASET_FORMS`, raw or already tokenized; a preference trainer also takes an implicit prompt, which TRL
extracts from `chosen` / `rejected` as their shared start); a dataset passes when it holds every column of one set.
Datasets stock TRL reads through the user's own code are not checked (`_user_reads_rows`: SFT's `formatting_func`
or `skip_prepare_dataset`, GRPO's `environment_factory`), nor streaming datasets whose columns are unknown.
tests/patches/setup/test_dataset_formats.py walks TRL's documented formats for every patched trainer, stock and patched.
"""

from __future__ import annotations

from .trainer_setup import SetupCall

EXPLICIT_PREFERENCE, IMPLICIT_PREFERENCE = ("prompt", "chosen", "rejected"), ("chosen", "rejected")
PREFERENCE = (IMPLICIT_PREFERENCE, EXPLICIT_PREFERENCE)

# algorithm -> the column sets its TRL 1.16 trainer accepts (the explicit-prompt form is listed beside the implicit
# one it contains, so the message names the prompt column too)
DATASET_FORMS: dict[str, tuple[tuple[str, ...], ...]] = {
    "grpo": (("prompt",),),
    "rloo": (("prompt",),),
    "dpo": PREFERENCE,
    "kto": (("prompt", "completion", "label"), *PREFERENCE),  # paired rows are unpaired by TRL
    "sft": (("text",), ("messages",), ("prompt", "completion"), ("conversations",), ("input_ids",)),
    # tokenized: chosen_ids / rejected_ids, or the legacy chosen_input_ids / rejected_input_ids TRL still renames
    "reward": (*PREFERENCE, ("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")),
    "orpo": PREFERENCE,
    "cpo": PREFERENCE,
    "ppo": (("prompt",), ("input_ids",)),  # slimrl's own PPOTrainer (slimrl.ppo.rollout.prompt_token_ids)
    "gkd": (("messages",), ("input_ids",)),  # TRL's DataCollatorForChatML
    "gold": (("messages",), ("input_ids",)),
    "distillation": (("prompt",),),
    "online_dpo": (("prompt",),),  # experimental OnlineDPOTrainer and A2POTrainer: prompts only, rollouts on-line
    "a2po": (("prompt",),),
}


def _forms(algorithm: str, args) -> tuple[tuple[str, ...], ...]:
    forms = DATASET_FORMS[algorithm]
    text_field = getattr(args, "dataset_text_field", None)  # SFT: the user's own text column
    return forms + ((text_field,),) if text_field and (text_field,) not in forms else forms


def _user_reads_rows(algorithm: str, call: SetupCall) -> bool:
    """Whether stock TRL hands the rows to the user's own code, which may read any column: SFT's `formatting_func`
    (maps each row to a text) or `dataset_kwargs={"skip_prepare_dataset": True}` (rows go to the collator as they
    are); GRPO's `environment_factory` (the environment's `reset()` supplies a prompt the rows lack)."""
    if algorithm == "sft":
        dataset_kwargs = getattr(call.args, "dataset_kwargs", None) or {}
        return call.arguments.get("formatting_func") is not None or bool(dataset_kwargs.get("skip_prepare_dataset"))
    if algorithm == "grpo":
        return call.arguments.get("environment_factory") is not None
    return False


def check_dataset(algorithm: str, trainer: str, role: str, dataset, args, any_columns: bool = False) -> None:
    """Raise if `dataset` is empty or (unless `any_columns`) holds none of `algorithm`'s column sets."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None or isinstance(columns, dict):  # absent, streaming, or a DatasetDict
        return
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"{trainer}: {role} is empty (0 rows). Check the split and any filtering applied to it.")
    forms = _forms(algorithm, args)
    if any_columns or any(all(c in columns for c in form) for form in forms):
        return
    wanted = " or ".join("(" + ", ".join(form) + ")" for form in forms)
    raise ValueError(
        f"{trainer}: {role} has the columns {sorted(columns)}, but it needs {wanted}. Rename a column "
        "(dataset.rename_column('question', 'prompt')) or map the rows to one of these forms."
    )


def dataset_check(algorithm: str):
    """The trainer-time check of `algorithm`'s train and eval datasets."""

    def check(call: SetupCall) -> None:
        trainer = call.arguments["self"].__class__.__name__
        any_columns = _user_reads_rows(algorithm, call)
        datasets = [("train_dataset", call.arguments.get("train_dataset"))]
        eval_dataset = call.arguments.get("eval_dataset")
        evals = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
        datasets += [(f"eval_dataset{'[' + repr(name) + ']' if name else ''}", dataset) for name, dataset in evals]
        for role, dataset in datasets:
            check_dataset(algorithm, trainer, role, dataset, call.args, any_columns)

    check.__name__ = f"check_{algorithm}_datasets"
    return check
