"""TRL 1.16's documented dataset formats (docs/source/dataset_formats.md, trl/data_utils.py), one tiny dataset each.

Types: language modeling, prompt-only, prompt-completion, preference (explicit and implicit prompt), unpaired
preference, stepwise supervision; each in the standard (plain text) and conversational (lists of role/content
messages) format where the docs define one (stepwise supervision: standard only). Also ShareGPT's `conversations`
(`from` / `value` messages, converted by TRL's `maybe_convert_to_chatml`) and the already-tokenized forms some trainers
read (`input_ids`; DPO's `prompt_ids` / `chosen_ids` / `rejected_ids`; KTO's `prompt_ids` / `completion_ids` /
`label`; the reward model's `chosen_ids` / `rejected_ids` and its legacy `chosen_input_ids` / `rejected_input_ids`).

Words come from the tiny tokenizer's vocabulary; prompts and completions have different lengths, completions start
with a space (the word-level tokenizer would merge across the boundary otherwise), and implicit-prompt rows repeat the
prompt inside chosen and rejected, as TRL's `extract_prompt` expects.
"""

from __future__ import annotations

import _tiny as T

PROMPTS = [*T.PROMPTS, "write the product of 6 and 7"]
GOOD = ["7", "the answer is 19 .", "hello", "8 times 9 is 72 and that is the final result", "eight", "yes", "42 ."]
BAD = ["8 or 9 or maybe 10", "no", "good bye world and thanks", "71", "i think it is many numbers", "no no", "6"]
ROWS = 8


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _columns(kind: str, conversational: bool, n: int) -> dict[str, list]:
    p = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    g = [GOOD[i % len(GOOD)] for i in range(n)]
    b = [BAD[i % len(BAD)] for i in range(n)]
    labels = [i % 3 != 1 for i in range(n)]  # both labels present, not alternating
    if conversational:
        prompt = [_user(x) for x in p]
        good, bad = [_assistant(x) for x in g], [_assistant(x) for x in b]
        joined_good = [u + a for u, a in zip(prompt, good)]
        joined_bad = [u + a for u, a in zip(prompt, bad)]
    else:
        prompt, good, bad = p, [" " + x for x in g], [" " + x for x in b]
        joined_good, joined_bad = [u + a for u, a in zip(p, good)], [u + a for u, a in zip(p, bad)]
    unpaired = [gi if lab else bi for gi, bi, lab in zip(good, bad, labels)]
    return {
        "language_modeling": {"messages" if conversational else "text": joined_good},
        "prompt_only": {"prompt": prompt},
        "prompt_completion": {"prompt": prompt, "completion": good},
        "preference": {"prompt": prompt, "chosen": good, "rejected": bad},
        "implicit_preference": {"chosen": joined_good, "rejected": joined_bad},
        "unpaired_preference": {"prompt": prompt, "completion": unpaired, "label": labels},
        "stepwise_supervision": {
            "prompt": p,
            "completions": [[x, y] for x, y in zip(g, b)],
            "labels": [[True, False]] * n,
        },
    }[kind]


def _sharegpt(n: int) -> dict[str, list]:
    return {
        "conversations": [
            [{"from": "user", "value": PROMPTS[i % len(PROMPTS)]}, {"from": "assistant", "value": GOOD[i % len(GOOD)]}]
            for i in range(n)
        ]
    }


def _tokenized(kind: str, n: int) -> dict[str, list]:
    tok = T.tokenizer()

    def ids(texts):
        return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]

    p = ids(PROMPTS[i % len(PROMPTS)] for i in range(n))
    g = ids(GOOD[i % len(GOOD)] for i in range(n))
    b = ids(BAD[i % len(BAD)] for i in range(n))
    return {
        "tokenized_language_modeling": {"input_ids": [x + y for x, y in zip(p, g)]},
        "tokenized_preference": {"prompt_ids": p, "chosen_ids": g, "rejected_ids": b},
        "tokenized_unpaired_preference": {
            "prompt_ids": p,
            "completion_ids": g,
            "label": [i % 3 != 1 for i in range(n)],
        },
        "tokenized_pairs": {"chosen_ids": [x + y for x, y in zip(p, g)], "rejected_ids": [x + y for x, y in zip(p, b)]},
        "tokenized_pairs_legacy": {
            "chosen_input_ids": [x + y for x, y in zip(p, g)],
            "rejected_input_ids": [x + y for x, y in zip(p, b)],
        },
    }[kind]


TYPES = (
    "language_modeling",
    "prompt_only",
    "prompt_completion",
    "preference",
    "implicit_preference",
    "unpaired_preference",
)
TOKENIZED = (
    "tokenized_language_modeling",
    "tokenized_preference",
    "tokenized_unpaired_preference",
    "tokenized_pairs",
    "tokenized_pairs_legacy",
)
# every (name) of the walk: standard and conversational variants of each type, then the one-variant formats
FORMATS = (
    *(f"standard_{t}" for t in TYPES),
    "standard_stepwise_supervision",
    *(f"conversational_{t}" for t in TYPES),
    "conversational_sharegpt",
    *TOKENIZED,
)


def dataset(name: str, n: int = ROWS):
    """The tiny dataset of format `name` (one of FORMATS), `n` rows."""
    from datasets import Dataset

    if name == "conversational_sharegpt":
        return Dataset.from_dict(_sharegpt(n))
    if name in TOKENIZED:
        return Dataset.from_dict(_tokenized(name, n))
    flavour, kind = name.split("_", 1)
    return Dataset.from_dict(_columns(kind, flavour == "conversational", n))
