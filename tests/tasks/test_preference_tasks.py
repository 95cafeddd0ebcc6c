"""Built-in preference data (derived from the arithmetic task) and user preference sets: determinism, correctness of
chosen vs rejected, KTO balance, column errors before any model is loaded."""

import json

import pytest

from slimrl.tasks.custom import TaskError
from slimrl.tasks.preference import arithmetic_preference_splits, preference_dataset
from slimrl.tasks.rewards import closeness_reward, correctness_reward, parse_answer


def test_paired_rows_chosen_correct_rejected_wrong_and_deterministic():
    train, evaluation = arithmetic_preference_splits("dpo", 60, 8, seed=5, num_examples=2)
    again, _ = arithmetic_preference_splits("dpo", 60, 8, seed=5, num_examples=2)
    assert train.to_list() == again.to_list()
    assert arithmetic_preference_splits("dpo", 60, 8, seed=6)[0].to_list() != train.to_list()
    assert len(train) == 60 and len(evaluation) == 8 and {"prompt", "answer"} <= set(evaluation.column_names)
    copied = 0
    for row in train:
        assert correctness_reward([row["chosen"]], answer=[row["answer"]]) == [1.0]
        assert correctness_reward([row["rejected"]], answer=[row["answer"]]) == [0.0]
        wrong = parse_answer(row["rejected"][0]["content"])
        assert wrong is not None and wrong >= 0
        assert len([m for m in row["prompt"] if m["role"] == "assistant"]) == 2
        copied += any(m["content"] == row["rejected"][0]["content"] for m in row["prompt"] if m["role"] == "assistant")
    assert 0 < copied < 60  # some rejected answers copy a worked example, as the base model does
    # the prompts are exactly the GRPO task's (same held-out split)
    from slimrl.tasks import arithmetic_task

    grpo = arithmetic_task(60, 8, seed=5, num_examples=2)
    assert train["prompt"] == grpo.train_dataset["prompt"] and evaluation.to_list() == grpo.eval_dataset.to_list()


def test_kto_rows_are_balanced_and_labelled():
    train, _ = arithmetic_preference_splits("kto", 10, 2, seed=0)
    assert len(train) == 20 and sum(train["label"]) == 10
    for row in train:
        assert correctness_reward([row["completion"]], answer=[row["answer"]]) == [float(row["label"])]
    with pytest.raises(ValueError, match="known"):
        arithmetic_preference_splits("ppo", 10, 2)


def test_arithmetic_options_are_checked():
    from slimrl.tasks import arithmetic_task

    task = arithmetic_task(20, 4, seed=1, max_operand=5, operations="-", num_examples=3)
    for row in task.train_dataset:
        a, op, b = row["question"].split("?")[0].removeprefix("What is ").split()
        assert op == "-" and 0 <= int(b) <= int(a) <= 5
        assert len(row["prompt"]) == 8
    assert task.info == {"max_operand": 5, "operations": "-", "num_examples": 3}
    for bad in ({"max_operand": 0}, {"operations": "*"}, {"num_examples": 0}, {"colour": 1}):
        with pytest.raises(ValueError):
            arithmetic_task(5, 1, **bad)


def test_closeness_reward_is_dense_and_safe():
    conv = lambda t: [{"role": "assistant", "content": t}]  # noqa: E731
    scores = closeness_reward(
        [
            conv("<answer>7</answer>"),
            conv("<answer>8</answer>"),
            conv("<answer>9</answer>"),
            conv("7"),
            conv("<answer>" + "9" * 30 + "</answer>"),
        ],
        answer=["7"] * 5,
    )
    assert scores[0] == 1.0 and 0.3 < scores[1] < 0.4 and scores[2] < scores[1]
    assert scores[3] == 0.0 and scores[4] == 0.0
    with pytest.raises(ValueError, match="answer"):
        closeness_reward([conv("1")])


def test_user_preference_set_columns_renamed_or_named_in_error(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"question {i}", "good": "yes", "bad": "no"}) for i in range(3)))
    with pytest.raises(TaskError, match="--prompt_column"):
        preference_dataset("dpo", str(path))
    ds = preference_dataset("dpo", str(path), prompt_column="q", chosen_column="good", rejected_column="bad")
    assert set(ds.column_names) == {"prompt", "chosen", "rejected"} and ds[0]["chosen"] == "yes"
    with pytest.raises(TaskError, match="--label_column"):
        preference_dataset("kto", str(path), prompt_column="q", completion_column="good")
    with pytest.raises(TaskError, match="not found"):
        preference_dataset("dpo", str(tmp_path / "missing.jsonl"))
