"""The built-in `arithmetic` task: small addition/subtraction problems answered as `<answer>N</answer>`.

Choices made (measured on SmolLM2-135M-Instruct, see notes/machine.md and the README's main-job section):
- Told only to answer in `<answer>N</answer>`, the model used the format in 0/64 samples: every reward was equal and
  GRPO had no signal. With worked example turns (a user question and an assistant answer in the format, before the
  real question) it uses the format, so every prompt carries `num_examples` examples drawn from the same generator
  (never equal to the real question).
- The instruction is said once, as the system message (it replaces SmolLM2's default system prompt), and the
  questions are bare: on a CPU the step time is dominated by prompt tokens (G copies of each prompt go through
  generation prefill and the training forward), so every token of the prompt is paid for 16 times per step.
- Problems are small so a 135M model gets some right and correctness has variance. Defaults (measured, greedy, 128
  held-out problems, 3 worked examples): additions with operands 0-15 start at 0.34 and reached 0.49 after the
  default 30 steps; the wider 0-20 with subtraction starts at 0.20 and reached 0.34, rising only after step 20. The
  base model's wrong answers collapse onto a few favourites ("10", "12", "22"); the rewards pull it off them.
- Three worked examples: greedy accuracy on 0-9 additions was 0.10 with one example and 0.20-0.30 with three.
- Generation is deterministic: one `random.Random(seed)` shuffles the finite problem space; the eval split takes its
  first `num_eval_samples` distinct problems and the train split draws only from the rest, so an eval question never
  appears in training (checked: asking for more than half the space as eval raises).
"""

from __future__ import annotations

import random

from .rewards import closeness_reward, correctness_reward, format_reward

INSTRUCTION = "Answer with only the final number inside <answer></answer> tags."
DEFAULTS = {"max_operand": 15, "operations": "+", "num_examples": 3}


def question_text(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def _draw(rng: random.Random, max_operand: int, operations: str = "+-") -> tuple[int, str, int, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    op = rng.choice(operations)
    if op == "-" and b > a:
        a, b = b, a  # keep answers non-negative: a 135M model rarely handles signs
    return a, op, b, a + b if op == "+" else a - b


def build_prompt(question: str, examples: list[tuple[str, int]]) -> list[dict]:
    """Conversational prompt: the instruction as system message, the worked example turns, then the real question."""
    messages = [{"role": "system", "content": INSTRUCTION}]
    for example_question, example_answer in examples:
        messages += [
            {"role": "user", "content": example_question},
            {"role": "assistant", "content": f"<answer>{example_answer}</answer>"},
        ]
    return messages + [{"role": "user", "content": question}]


def _examples(rng: random.Random, n: int, max_operand: int, operations: str, avoid: tuple) -> list[tuple[str, int]]:
    examples = []
    while len(examples) < n:
        ea, eop, eb, eresult = _draw(rng, max_operand, operations)
        if (ea, eop, eb) != avoid:
            examples.append((question_text(ea, eop, eb), eresult))
    return examples


def problem_space(max_operand: int, operations: str) -> list[tuple[int, str, int, int]]:
    """Every distinct problem (a, op, b, result), in a fixed order."""
    problems = []
    for op in dict.fromkeys(operations):  # ordered, duplicates dropped
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                if op == "+":
                    problems.append((a, op, b, a + b))
                elif b <= a:  # keep answers non-negative: a 135M model rarely handles signs
                    problems.append((a, op, b, a - b))
    return problems


def _row(problem, rng: random.Random, max_operand: int, operations: str, num_examples: int) -> dict:
    a, op, b, result = problem
    question = question_text(a, op, b)
    examples = _examples(rng, num_examples, max_operand, operations, avoid=(a, op, b))
    return {"prompt": build_prompt(question, examples), "answer": str(result), "question": question}


def check_options(max_operand: int, operations: str, num_examples: int) -> None:
    if not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand must be an integer >= 1, got {max_operand!r}")
    if not operations or set(operations) - set("+-"):
        raise ValueError(f"operations must be made of '+' and '-', got {operations!r}")
    if not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(
            f"num_examples must be >= 1 (with none, SmolLM2-135M never uses the format), got {num_examples!r}"
        )


def arithmetic_splits(
    num_train_samples: int = 1000,
    num_eval_samples: int = 64,
    seed: int = 42,
    max_operand: int = DEFAULTS["max_operand"],
    operations: str = DEFAULTS["operations"],
    num_examples: int = DEFAULTS["num_examples"],
):
    """(train, eval) `datasets.Dataset`s with columns prompt (messages), answer (str integer), question (str)."""
    from datasets import Dataset

    if num_train_samples < 1 or num_eval_samples < 0:
        raise ValueError("num_train_samples must be >= 1 and num_eval_samples >= 0")
    check_options(max_operand, operations, num_examples)
    problems = problem_space(max_operand, operations)
    if num_eval_samples > len(problems) // 2:
        raise ValueError(
            f"num_eval_samples={num_eval_samples} is more than half of the {len(problems)} distinct "
            f"problems with max_operand={max_operand} and operations={operations!r}: too few would be "
            "left to train on. Lower num_eval_samples or raise max_operand."
        )
    rng = random.Random(seed)
    rng.shuffle(problems)
    # Held out by construction: eval takes distinct problems first, train draws only from the rest (repeating them
    # in a fresh shuffled order when more rows are asked for than there are problems left)
    held_out, rest = problems[:num_eval_samples], problems[num_eval_samples:]
    eval_rows = [_row(p, rng, max_operand, operations, num_examples) for p in held_out]
    train_rows = []
    while len(train_rows) < num_train_samples:
        order = rest[:]
        rng.shuffle(order)
        train_rows += [
            _row(p, rng, max_operand, operations, num_examples) for p in order[: num_train_samples - len(train_rows)]
        ]
    return Dataset.from_list(train_rows), Dataset.from_list(eval_rows)


def format_user_prompt(
    text: str,
    seed: int = 0,
    max_operand: int = DEFAULTS["max_operand"],
    operations: str = DEFAULTS["operations"],
    num_examples: int = DEFAULTS["num_examples"],
):
    """Wrap free text from `slimrl generate` the way training prompts were built (same kind of worked examples)."""
    rng = random.Random(seed)
    return build_prompt(text.strip(), _examples(rng, num_examples, max_operand, operations, avoid=()))


def parse_answer_from_prompt_example(message: dict) -> int | None:
    """The integer of a worked example's assistant turn (`<answer>N</answer>`), or None."""
    from .rewards import parse_answer

    return parse_answer(message.get("content", ""))


REWARD_FUNCS = [format_reward, correctness_reward, closeness_reward]
ACCURACY_REWARD = correctness_reward
