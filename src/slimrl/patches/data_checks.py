"""The datasets a trainer is given, checked when it is built: a missing column or an empty dataset fails at once,
naming the trainer, what it needs and what the dataset has (TRL would fail later, deep inside preprocessing, with a
bare `KeyError: 'prompt'`).

Each trainer accepts one of several forms (the sets of columns TRL 1.16 reads, raw or already tokenized); a dataset
passes when it holds every column of one form. Streaming datasets whose columns are unknown are not checked.
"""

from __future__ import annotations

from .trainer_setup import SetupCall

# algorithm -> accepted column sets (TRL 1.16: implicit prompts are extracted from chosen/rejected where supported)
DATASET_FORMS: dict[str, tuple[tuple[str, ...], ...]] = {
    "grpo": (("prompt",),),
    "rloo": (("prompt",),),
    "dpo": (("chosen", "rejected"), ("prompt_ids", "chosen_ids", "rejected_ids")),
    "kto": (("completion", "label"), ("chosen", "rejected"), ("prompt_ids", "completion_ids", "label")),
    "sft": (("text",), ("messages",), ("prompt", "completion"), ("input_ids",)),
    "reward": (("chosen", "rejected"), ("chosen_ids", "rejected_ids")),
    "orpo": (("prompt", "chosen", "rejected"), ("chosen_input_ids", "rejected_input_ids")),
    "cpo": (("prompt", "chosen", "rejected"), ("chosen_input_ids", "rejected_input_ids")),
    "ppo": (("prompt",), ("input_ids",)),  # slimrl's own PPOTrainer (slimrl.ppo.rollout.prompt_token_ids)
    "gkd": (("messages",), ("input_ids",)),  # TRL's DataCollatorForChatML
    "gold": (("messages",), ("input_ids",)),
    "distillation": (("prompt",),),
}


def _forms(algorithm: str, args) -> tuple[tuple[str, ...], ...]:
    forms = DATASET_FORMS[algorithm]
    text_field = getattr(args, "dataset_text_field", None)  # SFT: the user's own text column
    return forms + ((text_field,),) if text_field and (text_field,) not in forms else forms


def check_dataset(algorithm: str, trainer: str, role: str, dataset, args) -> None:
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None or isinstance(columns, dict):  # absent, streaming, or a DatasetDict
        return
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"{trainer}: {role} is empty (0 rows). Check the split and any filtering applied to it.")
    forms = _forms(algorithm, args)
    if any(all(c in columns for c in form) for form in forms):
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
        check_dataset(algorithm, trainer, "train_dataset", call.arguments.get("train_dataset"), call.args)
        eval_dataset = call.arguments.get("eval_dataset")
        evals = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
        for name, dataset in evals:
            check_dataset(
                algorithm, trainer, f"eval_dataset{'[' + repr(name) + ']' if name else ''}", dataset, call.args
            )

    check.__name__ = f"check_{algorithm}_datasets"
    return check
