"""The tokenizer FastLanguageModel.from_pretrained returns gives transformers 4.x's result for
`apply_chat_template(..., tokenize=True)`: the token ids (Unsloth's notebooks take its `len` and store it)."""

import copy
import logging
import pickle

from datasets import Dataset

from slimrl import FastLanguageModel
from slimrl.models import chat_template_ids
from slimrl.testing import tiny_tokenizer

MESSAGES = [{"role": "user", "content": "what is 3 plus 4 ?"}]


def test_tokenize_true_gives_the_ids_with_one_notice(tiny_model_dir, caplog):
    _, tokenizer = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32")
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
        assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True) == ids  # tokenize's default
    assert ids == expected and len(ids) == len(expected) > 2
    notices = [r.message for r in caplog.records if "transformers 4.x" in r.message]
    assert len(notices) == 1 and "return_dict=True" in notices[0]
    # what the caller asked for explicitly is kept
    encoding = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)
    assert encoding["input_ids"] == ids
    assert isinstance(tokenizer.apply_chat_template(MESSAGES, tokenize=False), str)
    assert tokenizer.apply_chat_template(MESSAGES, return_tensors="pt").shape == (
        1,
        len(tokenizer.apply_chat_template(MESSAGES)),
    )


def test_dataset_map_stores_the_ids_as_the_notebooks_do(tiny_model_dir):
    _, tokenizer = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32")
    dataset = Dataset.from_dict({"prompt": [MESSAGES, MESSAGES + [{"role": "user", "content": "and 5 ?"}]]})
    tokens = dataset.map(
        lambda x: {"tokens": tokenizer.apply_chat_template(x["prompt"], add_generation_prompt=True, tokenize=True)},
        batched=True,
    )["tokens"]
    assert [len(t) for t in tokens] == [
        len(tokenizer.apply_chat_template(p, add_generation_prompt=True)) for p in dataset["prompt"]
    ]
    assert len(tokens[1]) > len(tokens[0])


def test_only_that_tokenizer_changes_and_the_swap_is_reversible(tiny_model_dir):
    _, tokenizer = FastLanguageModel.from_pretrained(tiny_model_dir, dtype="float32")
    other = tiny_tokenizer()
    assert (
        len(other.apply_chat_template(MESSAGES, tokenize=True)) == 2
    )  # negative control: transformers 5's BatchEncoding
    for twin in (copy.deepcopy(tokenizer), pickle.loads(pickle.dumps(tokenizer))):
        assert isinstance(twin.apply_chat_template(MESSAGES, tokenize=True), list)
        assert twin.apply_chat_template.tokenizer is twin
    chat_template_ids.restore(tokenizer)
    assert not chat_template_ids.is_swapped(tokenizer)
    assert len(tokenizer.apply_chat_template(MESSAGES, tokenize=True)) == 2
