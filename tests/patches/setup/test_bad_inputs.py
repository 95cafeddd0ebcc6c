"""Bad input to the patched trainers fails when the trainer is built, before any rollout or tokenization, with a
message naming the field or value and the fix (the README's "When things go wrong" table lists each)."""

import pytest
from datasets import Dataset

from slimrl import PatchFastRL

import _orpo_cpo_parity as O
import _pref_parity as H
import _rl_parity as R
import _tiny as T


def _grpo(tmp_path, dataset, **kwargs):
    PatchFastRL("grpo")
    config = R.make_config("grpo", str(tmp_path))
    return R.trl_classes("grpo")[1](
        model=T.tiny_model(),
        reward_funcs=R.reward_ids,
        args=config,
        train_dataset=dataset,
        processing_class=kwargs.pop("tokenizer", T.tokenizer()),
        **kwargs,
    )


def test_grpo_dataset_without_prompt_column(tmp_path, unpatched):
    with pytest.raises(
        ValueError,
        match=r"GRPOTrainer: train_dataset has the columns \['question'\], but it needs "
        r"\(prompt\).*rename_column",
    ):
        _grpo(tmp_path, Dataset.from_dict({"question": ["a", "b"]}))


def test_empty_dataset(tmp_path, unpatched):
    with pytest.raises(ValueError, match=r"GRPOTrainer: train_dataset is empty \(0 rows\)"):
        _grpo(tmp_path, Dataset.from_dict({"prompt": []}))


def test_eval_dataset_is_checked_too(tmp_path, unpatched):
    with pytest.raises(ValueError, match=r"eval_dataset has the columns \['text'\]"):
        _grpo(tmp_path, R.dataset(), eval_dataset=Dataset.from_dict({"text": ["x"]}))


@pytest.mark.parametrize(
    "algorithm, columns, needs",
    [
        ("dpo", {"prompt": ["p"], "good": ["a"], "bad": ["b"]}, r"\(chosen, rejected\)"),
        (
            "kto",
            {"prompt": ["p"], "answer": ["a"]},
            r"\(prompt, completion, label\) or \(chosen, rejected\) or \(prompt, chosen, rejected\)",
        ),
        ("sft", {"question": ["q"]}, r"\(text\) or \(messages\) or \(prompt, completion\)"),
        ("reward", {"good": ["a"]}, r"\(chosen, rejected\)"),
    ],
)
def test_offline_trainers_name_the_columns_they_need(algorithm, columns, needs, tmp_path, unpatched):
    PatchFastRL(algorithm)
    config_cls, trainer_cls = H.trl_classes(algorithm)
    model = H.tiny_reward_model() if algorithm == "reward" else T.tiny_model()
    with pytest.raises(ValueError, match=rf"train_dataset has the columns .* but it needs {needs}"):
        trainer_cls(
            model=model,
            args=config_cls(output_dir=str(tmp_path), report_to="none"),
            train_dataset=Dataset.from_dict(columns),
            processing_class=T.tokenizer(),
            **({"peft_config": T.lora_config()} if algorithm in ("dpo", "kto") else {}),
        )


@pytest.mark.parametrize("algorithm", ["orpo", "cpo"])
def test_orpo_cpo_name_the_explicit_and_implicit_prompt_forms(algorithm, tmp_path, unpatched):
    """TRL extracts an implicit prompt from chosen/rejected (the shared start), so the prompt column is optional."""
    PatchFastRL(algorithm)
    config_cls, trainer_cls = O.trl_classes(algorithm)
    with pytest.raises(ValueError, match=r"needs \(chosen, rejected\) or \(prompt, chosen, rejected\)\. Rename"):
        trainer_cls(
            model=T.tiny_model(),
            args=config_cls(output_dir=str(tmp_path), report_to="none"),
            train_dataset=Dataset.from_dict({"prompt": ["p"], "chosen": ["a"]}),
            processing_class=T.tokenizer(),
        )


def test_sft_dataset_text_field_is_a_form(tmp_path, unpatched):
    PatchFastRL("sft")
    config_cls, trainer_cls = H.trl_classes("sft")
    trainer = trainer_cls(
        model=T.tiny_model(),
        args=config_cls(output_dir=str(tmp_path), report_to="none", dataset_text_field="body", max_length=32),
        train_dataset=Dataset.from_dict({"body": ["hello world"] * 2}),
        processing_class=T.tokenizer(),
    )
    assert trainer.train_dataset is not None


def test_tokenizer_without_pad_or_eos(tmp_path, unpatched):
    tokenizer = T.tokenizer()
    tokenizer.pad_token, tokenizer.eos_token = None, None
    with pytest.raises(ValueError, match=r"neither a pad token nor an eos token.*tokenizer.pad_token"):
        _grpo(tmp_path, R.dataset(), tokenizer=tokenizer)


def test_num_generations_below_two(tmp_path, unpatched):
    PatchFastRL("grpo")
    with pytest.raises(
        ValueError, match=r"num_generations=1 is out of range \(allowed: >= 2\): group-relative advantages"
    ):
        R.make_config("grpo", str(tmp_path), num_generations=1, per_device_train_batch_size=2)


def test_negative_control_good_input_builds(tmp_path, unpatched):
    assert _grpo(tmp_path, R.dataset()).train_dataset is not None
