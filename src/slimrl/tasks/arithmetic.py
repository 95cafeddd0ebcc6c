"""The built-in `arithmetic` task: small addition/subtraction problems answered as `<answer>N</answer>`.

Choices made (measured on SmolLM2-135M-Instruct, see notes/machine.md):
- Told only to answer in `<answer>N</answer>`, the model used the format in 0/64 samples: every reward was equal and
  GRPO had no signal. With a ONE-SHOT example turn (a user question and an assistant answer in the format, before the
  real question) 25/64 did, and a minimal GRPO loop lifted the format reward 0.51 → 0.99 in 20 steps. So every prompt
  carries one worked example, drawn from the same generator (never equal to the real question).
- Problems are small (operands up to `max_operand`, default 20, results never negative) so a 135M model gets some right
  and correctness has variance too.
- Generation is deterministic: one `random.Random(seed)` draws the train split, then the eval split, and eval
  questions never appear in the train split (held out by question text).
"""

from __future__ import annotations

import random

from .rewards import correctness_reward, format_reward

INSTRUCTION = "Answer with only the final number inside <answer></answer> tags."


def question_text(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def _draw(rng: random.Random, max_operand: int) -> tuple[int, str, int, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a  # keep answers non-negative: a 135M model rarely handles signs
    return a, op, b, a + b if op == "+" else a - b


def build_prompt(question: str, example_question: str, example_answer: int) -> list[dict]:
    """Conversational prompt: one worked example turn, then the real question."""
    return [
        {"role": "user", "content": example_question},
        {"role": "assistant", "content": f"<answer>{example_answer}</answer>"},
        {"role": "user", "content": question},
    ]


def make_rows(n: int, rng: random.Random, max_operand: int, exclude: set[str]) -> list[dict]:
    rows, seen = [], set(exclude)
    attempts = 0
    while len(rows) < n:
        attempts += 1
        a, op, b, result = _draw(rng, max_operand)
        question = question_text(a, op, b)
        if question in seen and attempts < 50 * n:  # the problem space is finite: allow repeats only if exhausted
            continue
        seen.add(question)
        while True:
            ea, eop, eb, eresult = _draw(rng, max_operand)
            if (ea, eop, eb) != (a, op, b):
                break
        rows.append({"prompt": build_prompt(question, question_text(ea, eop, eb), eresult),
                     "answer": str(result), "question": question})
    return rows


def arithmetic_splits(num_train_samples: int = 1000, num_eval_samples: int = 64, seed: int = 42, max_operand: int = 20):
    """(train, eval) `datasets.Dataset`s with columns prompt (messages), answer (str integer), question (str)."""
    from datasets import Dataset

    if num_train_samples < 1 or num_eval_samples < 0:
        raise ValueError("num_train_samples must be >= 1 and num_eval_samples >= 0")
    rng = random.Random(seed)
    eval_rows = make_rows(num_eval_samples, rng, max_operand, exclude=set())
    train_rows = make_rows(num_train_samples, rng, max_operand, exclude={r["question"] for r in eval_rows})
    return Dataset.from_list(train_rows), Dataset.from_list(eval_rows)


def format_user_prompt(text: str, seed: int = 0, max_operand: int = 20) -> list[dict]:
    """Wrap free text from `slimrl generate` the way training prompts were built (same one-shot example)."""
    rng = random.Random(seed)
    ea, eop, eb, eresult = _draw(rng, max_operand)
    question = text if INSTRUCTION in text else f"{text.strip()} {INSTRUCTION}"
    return build_prompt(question, question_text(ea, eop, eb), eresult)


REWARD_FUNCS = [format_reward, correctness_reward]
ACCURACY_REWARD = correctness_reward
