"""Arguments of the stack Unsloth's notebooks were written for (transformers 4.5x, TRL 0.2x): each keeps the meaning
it had, with one notice naming the old and the new spelling; both spellings with different values raise."""

import logging

import pytest
from datasets import Dataset

from slimrl.patches import registry
from slimrl.state import config_state

import _orpo_cpo_parity as O
import _pref_parity as H
import _rl_parity as R
import _tiny as T


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "slimrl"]


# -- warmup_ratio ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
def test_warmup_ratio_is_a_fractional_warmup_steps(algorithm, tmp_path, unpatched, caplog):
    harness = R if algorithm == "grpo" else H
    with pytest.raises(TypeError, match="warmup_ratio"):  # negative control: stock TRL 1.16 refuses it
        harness.make_config(algorithm, str(tmp_path), warmup_ratio=0.1)
    registry.PatchFastRL(algorithm)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        config = harness.make_config(algorithm, str(tmp_path), warmup_ratio=0.1)
    # transformers 4.x: ceil(steps x warmup_ratio) warm-up steps; transformers 5 reads warmup_steps < 1 the same way
    assert config.warmup_steps == 0.1 and config.get_warmup_steps(95) == 10
    assert any("warmup_ratio=0.1" in m and "warmup_steps=0.1" in m for m in _notices(caplog))
    assert harness.make_config(algorithm, str(tmp_path), warmup_ratio=0.25, warmup_steps=0.25).warmup_steps == 0.25
    with pytest.raises(ValueError, match=r"both warmup_ratio=0.1 and warmup_steps=5"):
        harness.make_config(algorithm, str(tmp_path), warmup_ratio=0.1, warmup_steps=5)
    with pytest.raises(ValueError, match=r"warmup_ratio=1\).*Set warmup_steps to the number of training steps"):
        harness.make_config(algorithm, str(tmp_path), warmup_ratio=1.0)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        harness.make_config(algorithm, str(tmp_path), warmup_ratio=1.5)


# -- max_prompt_length: GRPO / RLOO ----------------------------------------------------------------------------------
LONG_PROMPT = "please compute the sum of 12 and 7 and write the final answer step by step"
LIMIT = 6


def _online(algorithm, tmp_path, prompts, **config):
    args = R.make_config(algorithm, str(tmp_path), beta=0.0, **config)
    dataset = Dataset.from_dict({"prompt": prompts})
    return R.build_trainer(algorithm, T.tiny_model(), args, train_dataset=dataset)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_max_prompt_length_keeps_the_last_tokens(algorithm, tmp_path, unpatched, caplog):
    registry.PatchFastRL(algorithm)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        trainer = _online(algorithm, tmp_path, [LONG_PROMPT] * 4, max_prompt_length=LIMIT)
    assert any(f"max_prompt_length={LIMIT}): TRL 1.16 removed it" in m for m in _notices(caplog))
    full = T.tokenizer()(LONG_PROMPT)["input_ids"]
    short = "hello world"
    ids, _, _ = trainer._tokenize_prompts([LONG_PROMPT, short])
    # TRL <= 0.21: prompt_ids[:, -max_prompt_length:] on the tokenized prompt; shorter prompts untouched
    assert ids == [full[-LIMIT:], T.tokenizer()(short)["input_ids"]] and len(full) > LIMIT


def test_the_grpo_step_sees_only_the_kept_tokens(tmp_path, unpatched):
    """A step on the long prompt with the limit equals a step on the text of its kept tokens without one: same
    prompt ids, completions and loss (the loss never sees the cut tokens)."""
    registry.PatchFastRL("grpo")
    tokenizer = T.tokenizer()
    kept_text = tokenizer.decode(tokenizer(LONG_PROMPT)["input_ids"][-LIMIT:])
    assert tokenizer(kept_text)["input_ids"] == tokenizer(LONG_PROMPT)["input_ids"][-LIMIT:]
    traces = []
    for prompt, config in ((LONG_PROMPT, {"max_prompt_length": LIMIT}), (kept_text, {})):
        trainer = _online("grpo", tmp_path, [prompt] * 4, **config)
        trace = R.Trace()
        R.micro_step(trainer, [{"prompt": prompt}] * 4, 0, trace)
        traces.append(trace)
    cut, reference = traces
    prompt_ids = cut.inputs[0]["prompt_ids"][cut.inputs[0]["prompt_mask"].bool()].view(4, -1)
    assert prompt_ids.shape == (4, LIMIT)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert (cut.inputs[0][key] == reference.inputs[0][key]).all(), key
    assert cut.losses == reference.losses


def test_max_prompt_length_must_be_positive(tmp_path, unpatched):
    registry.PatchFastRL("grpo")
    with pytest.raises(ValueError, match="max_prompt_length must be a positive number of tokens"):
        R.make_config("grpo", str(tmp_path), max_prompt_length=0)


# -- max_prompt_length: DPO ------------------------------------------------------------------------------------------
def _preference(prompts):
    return Dataset.from_dict(
        {"prompt": prompts, "chosen": [" 7"] * len(prompts), "rejected": [" no no"] * len(prompts)}
    )


def test_dpo_prompt_keeps_its_last_tokens_before_max_length(tmp_path, unpatched):
    registry.PatchFastRL("dpo")
    tokenizer = T.tokenizer()
    prompts = [LONG_PROMPT, "hello world"]  # 16 and 2 tokens
    args = H.make_config("dpo", str(tmp_path), max_length=8, max_prompt_length=LIMIT)
    trainer = H.build_trainer("dpo", T.peft_model(), args, train_dataset=_preference(prompts))
    rows = trainer.train_dataset
    # TRL 0.2x's tokenize_row: prompt_input_ids[-max_prompt_length:]; the long row is kept (TRL 1.16 alone drops
    # a prompt that fills max_length)
    assert rows["prompt_ids"] == [tokenizer(p)["input_ids"][-LIMIT:] for p in prompts]
    assert rows["chosen_ids"] == [tokenizer(" 7")["input_ids"] + [T.EOS_ID]] * 2
    stock = H.build_trainer(
        "dpo", T.peft_model(), H.make_config("dpo", str(tmp_path), max_length=8), train_dataset=_preference(prompts)
    )
    assert len(stock.train_dataset) == 1  # negative control: without the limit, TRL drops the long prompt


# -- max_prompt_length: ORPO / CPO -----------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["orpo", "cpo"])
def test_orpo_cpo_cut_the_prompt_then_the_answers_as_trl_0_2x(algorithm, tmp_path, unpatched):
    registry.PatchFastRL(algorithm)
    tokenizer = T.tokenizer()
    prompt = " ".join(["hello"] * 10)  # 10 tokens
    chosen, rejected = " 7", " " + " ".join(["no"] * 10)  # answers of 2 and 11 tokens with the EOS
    dataset = Dataset.from_dict({"prompt": [prompt] * 3, "chosen": [chosen] * 3, "rejected": [rejected] * 3})
    args = O.make_config(algorithm, str(tmp_path), max_length=12, max_prompt_length=4)
    row = O.build_trainer(algorithm, T.tiny_model(), args, train_dataset=dataset).train_dataset[0]
    prompt_ids = tokenizer(prompt)["input_ids"]
    answer = tokenizer(rejected)["input_ids"] + [T.EOS_ID]
    # prompt (10) + longer answer (11) > 12: the prompt keeps its last 4; 4 + 11 > 12: answers keep 12 - 4 = 8
    assert row["prompt_input_ids"] == prompt_ids[-4:]
    assert row["rejected_input_ids"] == prompt_ids[-4:] + answer[:8]
    assert row["rejected_labels"] == [-100] * 4 + answer[:8]
    assert row["chosen_input_ids"] == prompt_ids[-4:] + tokenizer(chosen)["input_ids"] + [T.EOS_ID]
    # under the limit: untouched
    fits = O.make_config(algorithm, str(tmp_path), max_length=40, max_prompt_length=4)
    row = O.build_trainer(algorithm, T.tiny_model(), fits, train_dataset=dataset).train_dataset[0]
    assert row["prompt_input_ids"] == prompt_ids
    # negative control: TRL 1.16 alone keeps the whole prompt and leaves 12 - 10 = 2 answer tokens
    plain = O.make_config(algorithm, str(tmp_path), max_length=12)
    row = O.build_trainer(algorithm, T.tiny_model(), plain, train_dataset=dataset).train_dataset[0]
    assert row["prompt_input_ids"] == prompt_ids and row["rejected_input_ids"] == prompt_ids + answer[:2]


# -- trainer-level keywords of TRL 0.x -------------------------------------------------------------------------------
def test_dpo_trainer_keywords_move_to_the_config(tmp_path, unpatched, caplog):
    registry.PatchFastRL("dpo")
    from trl import DPOConfig, DPOTrainer

    tokenizer = T.tokenizer()
    args = DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, per_device_train_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        trainer = DPOTrainer(
            T.peft_model(), None, args=args, train_dataset=_preference(["hello world"] * 2), tokenizer=tokenizer,
            beta=0.3, max_length=40, max_prompt_length=LIMIT,
        )  # fmt: skip
    assert (args.beta, args.max_length, args.max_prompt_length) == (0.3, 40, LIMIT) and trainer.beta == 0.3
    assert {"beta", "max_length", "max_prompt_length"} <= config_state(args).user_fields  # the user's, not defaults
    assert trainer.processing_class is tokenizer
    said = _notices(caplog)
    assert any("DPOTrainer(beta=...) is a DPOConfig field in TRL 1.16; set beta=0.3 there" in m for m in said)
    assert any("DPOTrainer(tokenizer=...)" in m for m in said)
    same = DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, beta=0.3)
    DPOTrainer(T.peft_model(), args=same, train_dataset=_preference(["hello world"] * 2), tokenizer=tokenizer, beta=0.3)
    other = DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, beta=0.2)
    with pytest.raises(ValueError, match=r"DPOTrainer\(beta=0.3\) and DPOConfig\(beta=0.2\) disagree"):
        DPOTrainer(T.peft_model(), args=other, train_dataset=_preference(["x"]), tokenizer=tokenizer, beta=0.3)


@pytest.mark.parametrize("algorithm", ["orpo", "kto"])
def test_other_offline_trainers_take_beta_and_refuse_what_trl_removed(algorithm, tmp_path, unpatched):
    registry.PatchFastRL(algorithm)
    harness = O if algorithm == "orpo" else H
    config_cls, trainer_cls = harness.trl_classes(algorithm)
    args = harness.make_config(algorithm, str(tmp_path))
    dataset = O.dataset() if algorithm == "orpo" else H.dataset("kto")
    trainer = trainer_cls(model=T.peft_model(), args=args, train_dataset=dataset, tokenizer=T.tokenizer(), beta=0.25)
    assert args.beta == 0.25 and trainer.args.beta == 0.25
    if algorithm == "kto":
        with pytest.raises(TypeError, match=r"KTOTrainer\(max_prompt_length=...\): TRL 1.16 removed"):
            trainer_cls(model=T.peft_model(), args=args, train_dataset=dataset, max_prompt_length=8)
