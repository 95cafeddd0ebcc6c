"""Built-in task generation and reward functions: determinism, held-out split, good/malformed/adversarial inputs."""

import json
import os

import pytest

from slimrl.tasks import arithmetic_task, get_builtin_task
from slimrl.tasks.custom import TaskError, check_reward_columns, dataset_task, load_reward_func
from slimrl.tasks.rewards import MAX_PARSE_CHARS, completion_text, correctness_reward, format_reward, parse_answer


def conv(text):
    return [{"role": "assistant", "content": text}]


def test_arithmetic_is_deterministic_and_held_out():
    a, b = arithmetic_task(50, 10, seed=3), arithmetic_task(50, 10, seed=3)
    assert a.train_dataset.to_list() == b.train_dataset.to_list()
    assert a.eval_dataset.to_list() == b.eval_dataset.to_list()
    c = arithmetic_task(50, 10, seed=4)
    assert c.train_dataset.to_list() != a.train_dataset.to_list()
    assert len(a.train_dataset) == 50 and len(a.eval_dataset) == 10
    assert not set(a.eval_dataset["question"]) & set(a.train_dataset["question"])


def test_eval_is_held_out_even_when_train_exhausts_the_problem_space():
    from slimrl.tasks.arithmetic import problem_space

    task = arithmetic_task(500, 40, seed=1, max_operand=9, operations="+")  # 100 problems: train must repeat
    evaluation, train = task.eval_dataset["question"], task.train_dataset["question"]
    assert len(set(evaluation)) == 40 and not set(evaluation) & set(train)
    assert set(train) | set(evaluation) == {f"What is {a} {op} {b}?" for a, op, b, _ in problem_space(9, "+")}
    with pytest.raises(ValueError, match="more than half"):
        arithmetic_task(10, 51, max_operand=9, operations="+")


def test_arithmetic_rows_are_worked_example_conversations_with_correct_answers():
    from slimrl.tasks.arithmetic import INSTRUCTION

    task = arithmetic_task(30, 5, seed=0, num_examples=1)
    for row in task.train_dataset:
        prompt = row["prompt"]
        assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
        assert prompt[0]["content"] == INSTRUCTION
        assert prompt[2]["content"].startswith("<answer>") and prompt[1]["content"] != prompt[3]["content"]
        a, op, b = prompt[3]["content"].split("?")[0].removeprefix("What is ").split()
        expected = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert row["answer"] == str(expected) and expected >= 0
        # the worked example is itself correct
        ea, eop, eb = prompt[1]["content"].split("?")[0].removeprefix("What is ").split()
        assert parse_answer(prompt[2]["content"]) == (int(ea) + int(eb) if eop == "+" else int(ea) - int(eb))
    assert get_builtin_task("arithmetic", num_train_samples=3, num_eval_samples=1).name == "arithmetic"
    with pytest.raises(ValueError, match="built-in tasks"):
        get_builtin_task("chess")


@pytest.mark.parametrize(
    "completion,fmt,correct",
    [
        (conv("<answer>12</answer>"), 1.0, 1.0),
        (conv("The sum is 12.\n<answer> 12 </answer>"), 1.0, 1.0),
        ("<answer>12</answer>", 1.0, 1.0),  # plain-string completion
        ({"role": "assistant", "content": "<answer>12</answer>"}, 1.0, 1.0),
        (conv("<answer>13</answer>"), 1.0, 0.0),  # wrong value, right format
        (conv("12"), 0.0, 0.0),  # no tags
        (conv("<answer>twelve</answer>"), 0.0, 0.0),
        (conv("<answer>12"), 0.0, 0.0),  # unclosed
        (conv("<answer>12</answer><answer>13</answer>"), 0.0, 0.0),  # hedging with several answers
        (conv("<answer>12</answer><answer>12</answer>"), 0.0, 0.0),
        (conv("<answer>١٢</answer>"), 0.0, 0.0),  # unicode (Arabic-Indic) digits are not the format
        (conv("<answer>12.0</answer>"), 0.0, 0.0),
        (conv("<answer>" + "9" * 40 + "</answer>"), 0.0, 0.0),  # absurdly long number
        (conv(""), 0.0, 0.0),
        (None, 0.0, 0.0),
        (42, 0.0, 0.0),
        ([{"role": "assistant", "content": None}], 0.0, 0.0),
        (conv("💥" * 1000 + "<answer>12</answer>"), 1.0, 1.0),
    ],
)
def test_rewards_on_good_malformed_and_adversarial(completion, fmt, correct):
    assert format_reward([completion]) == [fmt]
    assert correctness_reward([completion], answer=["12"]) == [correct]


def test_rewards_on_huge_completion_are_bounded_and_fast():
    huge = "<answer>" * 200_000 + "x" * 1_000_000
    assert format_reward([conv(huge)]) == [0.0]
    late = "a" * (MAX_PARSE_CHARS + 10) + "<answer>12</answer>"
    assert correctness_reward([conv(late)], answer=["12"]) == [0.0]  # only the first MAX_PARSE_CHARS are read


def test_correctness_handles_answer_types_and_missing_column():
    completions = [conv("<answer>-3</answer>"), conv("<answer>7</answer>"), conv("<answer>7</answer>")]
    assert correctness_reward(completions, answer=["-3", 7, "abc"]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        correctness_reward(completions)
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}]) == "a"


def test_load_reward_func_forms(tmp_path, monkeypatch):
    assert load_reward_func("format_reward") is format_reward
    assert load_reward_func("slimrl.tasks.rewards.correctness_reward") is correctness_reward
    f = tmp_path / "my_rewards.py"
    f.write_text("def length_reward(completions, **kw):\n    return [float(len(str(c))) for c in completions]\n")
    func = load_reward_func(f"{f}:length_reward")
    assert func(["ab"]) == [2.0]
    monkeypatch.chdir(tmp_path)
    assert load_reward_func("my_rewards.length_reward")(["abc"]) == [3.0]
    for bad, msg in [
        ("nope_module_xyz.f", "Could not import"),
        (f"{f}:missing", "no attribute"),
        ("/no/such/file.py:f", "not found"),
        ("justaname", "neither"),
    ]:
        with pytest.raises(TaskError, match=msg):
            load_reward_func(bad)


def test_check_reward_columns():
    def needs_solution(completions, solution, **kw):
        return [0.0] * len(completions)

    check_reward_columns(needs_solution, ["prompt", "solution"])
    with pytest.raises(TaskError, match="solution"):
        check_reward_columns(needs_solution, ["prompt"])


def test_dataset_task_from_local_files(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(20)]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = dataset_task(str(path), ["correctness_reward"], prompt_column="question", num_eval_samples=5, seed=0)
    assert "prompt" in task.train_dataset.column_names and "question" not in task.train_dataset.column_names
    assert len(task.eval_dataset) == 5 and len(task.train_dataset) == 15
    again = dataset_task(str(path), ["correctness_reward"], prompt_column="question", num_eval_samples=5, seed=0)
    assert again.eval_dataset["prompt"] == task.eval_dataset["prompt"]
    with pytest.raises(TaskError, match="no column 'prompt'"):
        dataset_task(str(path), ["correctness_reward"])
    with pytest.raises(TaskError, match="not found"):
        dataset_task(str(tmp_path / "missing.csv"), ["correctness_reward"])
    with pytest.raises(TaskError, match="at least one"):
        dataset_task(str(path), [], prompt_column="question")
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\nhi,1\nyo,2\n")
    assert dataset_task(str(csv), ["format_reward"], num_eval_samples=0).train_dataset["prompt"] == ["hi", "yo"]
    assert os.path.exists(csv)
