"""What the patched OnlineDPOTrainer refuses or adapts before any rollout, each naming the option: an image dataset,
a model loaded with fast_inference=True, a judge together with reward functions, a judge without `judge()`, a judge
answering -1, `max_length` or `max_new_tokens` beyond the model's max_seq_length; `judge=` and `reward_model=` (older
TRL's arguments) taken as `reward_funcs=`; `from trl import OnlineDPOTrainer` while patched."""

import logging

import pytest
from datasets import Dataset

from slimrl.patches.rollouts.judges import PairwiseJudgeReward

import _online_parity as O
import _parity as P
import _tiny as T

ALGO = "online_dpo"


class SecondIsBetter:
    def judge(self, prompts, completions, shuffle_order=True):
        return [1] * len(prompts)


class FailingJudge:
    def judge(self, prompts, completions, shuffle_order=True):
        return [-1] * len(prompts)


def _trainer(tmp_path, model=None, train_dataset=None, config=None, **kwargs):
    from trl.experimental.online_dpo import OnlineDPOTrainer

    args = O.make_config(ALGO, str(tmp_path), **(config or {}))
    if "judge" not in kwargs and "reward_model" not in kwargs:
        kwargs.setdefault("reward_funcs", O.reward_ids)
    return OnlineDPOTrainer(
        model=model if model is not None else T.tiny_model(0),
        args=args,
        train_dataset=train_dataset if train_dataset is not None else O.dataset(),
        processing_class=T.tokenizer(),
        **kwargs,
    )


@pytest.fixture
def patched():
    with P.side_state("patched", ALGO):
        yield


def test_image_dataset_refused(tmp_path, patched):
    images = Dataset.from_dict({"prompt": ["a", "b"], "image": [None, None]})
    with pytest.raises(NotImplementedError, match="'image' column"):
        _trainer(tmp_path, train_dataset=images)


def test_fast_inference_model_refused(tmp_path, patched):
    model = T.tiny_model(0)
    model.vllm_engine = object()  # what FastLanguageModel.from_pretrained(fast_inference=True) attaches
    with pytest.raises(ValueError, match="fast_inference=True"):
        _trainer(tmp_path, model=model)


def test_judge_and_reward_functions_refused(tmp_path, patched):
    with pytest.raises(ValueError, match="both judge=SecondIsBetter.*and reward_funcs="):
        _trainer(tmp_path, judge=SecondIsBetter(), reward_funcs=O.reward_ids)
    with pytest.raises(TypeError, match="no judge\\(prompts, completions\\) method"):
        _trainer(tmp_path, judge=object())


def test_judge_taken_as_reward_with_a_notice(tmp_path, patched, caplog):
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        trainer = _trainer(tmp_path, judge=SecondIsBetter())
    assert isinstance(trainer.reward_funcs[0], PairwiseJudgeReward)
    assert trainer.reward_func_names == ["SecondIsBetter"]
    assert "judge=" in caplog.text and "PairwiseJudgeReward(SecondIsBetter)" in caplog.text
    rewards = trainer.reward_funcs[0](prompts=["p", "q", "p", "q"], completions=["a", "b", "c", "d"])
    assert rewards == [0.0, 0.0, 1.0, 1.0]


def test_failing_judge_named(patched):
    reward = PairwiseJudgeReward(FailingJudge())
    with pytest.raises(ValueError, match="FailingJudge.judge returned -1 for prompt 0"):
        reward(prompts=["p", "p"], completions=["a", "b"])
    with pytest.raises(ValueError, match="not in pairs"):
        reward(prompts=["p", "q"], completions=["a", "b"])


def test_reward_model_argument_is_reward_funcs(tmp_path, patched):
    trainer = _trainer(tmp_path, reward_model=O.reward_ids, reward_funcs=None)
    assert trainer.reward_func_names == ["reward_ids"]


def test_lengths_against_max_seq_length(tmp_path, patched):
    model = T.tiny_model(0)
    model.max_seq_length = 24
    with pytest.raises(ValueError, match=r"max_length=64 in the config exceeds the model's max_seq_length=24"):
        _trainer(tmp_path, model=model)
    with pytest.raises(ValueError, match=r"max_new_tokens \(30\) leaves no room"):
        _trainer(tmp_path, model=model, config=dict(max_length=20, max_new_tokens=30))


def test_trl_alias_while_patched(unpatched):
    import trl

    assert not hasattr(trl, "OnlineDPOTrainer")
    with P.side_state("patched", ALGO):
        from trl import OnlineDPOConfig, OnlineDPOTrainer
        from trl.experimental.online_dpo import OnlineDPOTrainer as Experimental

        assert OnlineDPOTrainer is Experimental and OnlineDPOConfig.__name__ == "OnlineDPOConfig"
    assert not hasattr(trl, "OnlineDPOTrainer")
