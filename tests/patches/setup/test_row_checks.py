"""patches/setup/row_checks.py: a malformed row in a trainer's dataset fails when the trainer is built, naming the
dataset,
the row index and the column (TRL would fail inside its preprocessing `map`, naming neither, or train on it)."""

import pytest
from datasets import Dataset

from slimrl import PatchFastRL
from slimrl.patches.setup.row_checks import EITHER, LABEL, MESSAGES, TEXT, cell_problem

import _pref_parity as H
import _rl_parity as R
import _tiny as T

GOOD = [{"role": "user", "content": "what is 2 + 2?"}]


@pytest.mark.parametrize(
    "value, kind, problem",
    [
        ("what is 2 + 2?", EITHER, None),
        (GOOD, EITHER, None),
        ([{"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}], MESSAGES, None),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], EITHER, None),
        (True, LABEL, None),
        (None, EITHER, "empty (None)"),
        (17, EITHER, "a int (17), not a string or a list of chat messages"),
        ([{"content": "hi"}], EITHER, 'a message list whose message 0 has no "role"'),
        ([{"role": None, "content": "hi"}], EITHER, 'a message list whose message 0 has no "role"'),
        ([{"role": "user"}], EITHER, 'a message list whose message 0 has no "content"'),
        ([{"role": "user", "content": 3}], EITHER, 'a message list whose message 0 has a "content" that is a int'),
        (["hi"], EITHER, "a message list whose message 0 is a str, not a message dict"),
        ([], EITHER, "an empty list of messages"),
        ("hi", MESSAGES, "a string, not a list of chat messages"),
        (GOOD, TEXT, "a list"),
        ("yes", LABEL, "'yes', not True or False"),
    ],
)
def test_cell_problems(value, kind, problem):
    found = cell_problem(value, kind)
    assert found == problem if problem is None else found.startswith(problem), found


def _prompts(bad_row: int | None, bad_value):
    rows = [[{"role": "user", "content": f"question {i}"}] for i in range(24)]
    if bad_row is not None:
        rows[bad_row] = bad_value
    return Dataset.from_dict({"prompt": rows})


def _grpo(tmp_path, dataset):
    PatchFastRL("grpo")
    return R.trl_classes("grpo")[1](
        model=T.tiny_model(),
        reward_funcs=R.reward_ids,
        args=R.make_config("grpo", str(tmp_path)),
        train_dataset=dataset,
        processing_class=T.tokenizer(),
    )


@pytest.mark.parametrize(
    "bad_value, problem",
    [
        (None, "empty (None)"),
        ([{"role": "user", "content": "q"}, {"content": "no role"}], 'a message list whose message 1 has no "role"'),
    ],
)
def test_grpo_names_row_17_and_the_column(tmp_path, unpatched, bad_value, problem):
    with pytest.raises(ValueError) as err:
        _grpo(tmp_path, _prompts(17, bad_value))
    message = str(err.value)
    assert message.startswith(f"GRPOTrainer: train_dataset row 17, column 'prompt' is {problem}"), message
    assert "dataset.filter" in message


def test_a_number_in_a_prompt_column_is_named(tmp_path, unpatched):
    with pytest.raises(ValueError, match=r"train_dataset row 0, column 'prompt' is a int \(0\), not a string"):
        _grpo(tmp_path, Dataset.from_dict({"prompt": list(range(8))}))


def test_well_formed_rows_build(tmp_path, unpatched):  # the negative control
    assert _grpo(tmp_path, _prompts(None, None)).train_dataset is not None


def test_dpo_and_kto_rows_are_checked_in_their_columns(tmp_path, unpatched):
    PatchFastRL("dpo")
    config_cls, trainer_cls = H.trl_classes("dpo")
    rejected = ["no"] * 20
    rejected[3] = None
    with pytest.raises(ValueError, match=r"DPOTrainer: train_dataset row 3, column 'rejected' is empty \(None\)"):
        trainer_cls(
            model=T.tiny_model(),
            args=config_cls(output_dir=str(tmp_path), report_to="none"),
            train_dataset=Dataset.from_dict({"prompt": ["p"] * 20, "chosen": ["yes"] * 20, "rejected": rejected}),
            processing_class=T.tokenizer(),
            peft_config=T.lora_config(),
        )
    PatchFastRL("kto")
    config_cls, trainer_cls = H.trl_classes("kto")
    labels = [True, False] * 5
    labels[9] = None
    with pytest.raises(ValueError, match=r"KTOTrainer: eval_dataset row 9, column 'label' is empty"):
        trainer_cls(
            model=T.tiny_model(),
            args=config_cls(output_dir=str(tmp_path), report_to="none"),
            train_dataset=Dataset.from_dict({"prompt": ["p"] * 2, "completion": ["c"] * 2, "label": [True, False]}),
            eval_dataset=Dataset.from_dict({"prompt": ["p"] * 10, "completion": ["c"] * 10, "label": labels}),
            processing_class=T.tokenizer(),
            peft_config=T.lora_config(),
        )
