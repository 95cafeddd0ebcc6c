"""Patched OnlineDPOTrainer ≡ stock TRL 1.16's experimental OnlineDPOTrainer: same rollouts, loss, gradients, metrics
and parameters over 2 steps (the rule of _parity), with a reward function, a reward model or a judge.

Cases: LoRA (adapter-disabled reference) with a callable reward and 3 chunks; full fine-tuning (TRL's frozen copy as
reference) with the IPO loss, prompts truncated by a small `max_length`, `missing_eos_penalty` and 1 chunk; gradient
checkpointing with accumulation and automatic chunks; a sequence-classification reward model; a pairwise judge
(`judge=` on the patched side, slimrl's PairwiseJudgeReward given as the reward on the stock sides). Negative control:
log-probs 0.1% off fail the comparison. The patched step never computes lm_head over more than one position.
"""

import copy

import pytest
import torch

import _harness as HS
import _online_parity as O
import _parity as P
import _pref_parity as H
import _tiny as T

ALGO = "online_dpo"


class FirstWordJudge:
    """An offline pairwise judge: prefers the completion with more distinct words (ties: the first)."""

    def judge(self, prompts, completions, shuffle_order=True):
        return [0 if len(set(a.split())) >= len(set(b.split())) else 1 for a, b in completions]


def _judge_kwargs(side):
    from slimrl.patches.rollouts.judges import PairwiseJudgeReward

    judge = FirstWordJudge()
    return {"judge": judge} if side == "patched" else {"reward": PairwiseJudgeReward(judge)}


def _reward_model_kwargs(side):
    reward_model = H.tiny_reward_model(5)  # float32 on every side: the rewards are inputs, not under test
    return {"reward": reward_model, "reward_processing_classes": T.tokenizer()}


DEFAULT_TIER = "lora-sigmoid-chunks3"  # the case the default tier runs; the others are slow tier
CASES = {
    "lora-sigmoid-chunks3": (True, 3, dict(beta=0.1), None),
    "full-ipo-truncated-eospenalty-chunks1": (
        False,
        1,
        dict(loss_type="ipo", beta=0.5, max_length=10, missing_eos_penalty=1.0),
        None,
    ),
    "lora-checkpointing-ga2-auto": (True, -1, dict(gradient_checkpointing=True, gradient_accumulation_steps=2), None),
    "lora-reward-model": (True, 3, {}, _reward_model_kwargs),
    "lora-judge": (True, 3, {}, _judge_kwargs),
}


def _run(tmp_path, lora, chunks, config, trainer_kwargs):
    trainers = HS.tiny_sides(O.build_sides, ALGO, config, tmp_path, lora, chunks, trainer_kwargs=trainer_kwargs)
    return trainers, O.run_sides(ALGO, trainers)


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == DEFAULT_TIER else pytest.mark.slow) for c in CASES])
def test_online_dpo_matches_stock(case, tmp_path, unpatched):
    lora, chunks, config, trainer_kwargs = CASES[case]
    trainers, traces = _run(tmp_path, lora, chunks, config, trainer_kwargs)
    O.assert_traces_match(traces)
    stock = traces.stock
    assert all(loss != 0 for loss in stock.losses)
    assert max(stock.metrics["objective/kl"]) > 0 or not lora, "the reference should differ from the policy"
    assert "peak_memory_gb" in traces.patched.metrics and "peak_memory_gb" not in stock.metrics
    if config.get("max_length", 64) < 16:  # the prompts really were cut by stock's left truncation
        lengths = [x["prompt_ids"].shape[1] + x["completion_ids"].shape[1] for x in stock.inputs]
        assert max(lengths) > config["max_length"]
    if chunks == 3:
        from slimrl.ops.lean_logprob import LeanLogProbFunction

        assert LeanLogProbFunction.last_forward_chunks == 3


def test_logprobs_off_by_a_thousandth_fail(tmp_path, unpatched):
    """Negative control: the patched side's log-probs scaled by 1.001 fail the loss and gradient comparison."""
    trainers = O.build_sides(ALGO, lambda: T.tiny_model(0), {}, str(tmp_path), T.lora_config(), num_chunks=3)
    forward = trainers.patched._forward
    trainers.patched._forward = lambda *a, **kw: forward(*a, **kw) * 1.001
    traces = O.run_sides(ALGO, trainers)
    with pytest.raises(AssertionError, match="loss|grad"):
        P.assert_steps_match(traces)


def test_patched_step_never_builds_full_logits(tmp_path, unpatched):
    """lm_head runs over one position per row at a time (generation's last token) in the patched step; stock's
    `_forward` runs it over every position of the prompt and completion."""

    def widest_head_output(side):
        with P.side_state(side, ALGO):
            args = O.make_config(ALGO, str(tmp_path))
            trainer = O.build_trainer(ALGO, T.tiny_model(0), args, T.lora_config())
            widths = []
            hook = trainer.model.get_base_model().lm_head.register_forward_hook(
                lambda module, inputs, output: widths.append(output.shape[1])
            )
            torch.manual_seed(1)
            trainer.training_step(trainer.model, O.batch_of(ALGO, trainer), None)
            hook.remove()
        # slimrl's head was installed for each call only: the model keeps its own forward
        assert "forward" not in trainer.model.get_base_model().__dict__
        return max(widths)

    assert widest_head_output("patched") == 1
    assert widest_head_output("stock") > 8


@pytest.mark.slow
def test_end_to_end_train_matches_stock(tmp_path, unpatched):
    """`trainer.train()` for 2 steps (TRL's loop, optimizer and logging): the same gradients at every optimizer step
    (logged scalars and final weights alone hide a small change of the step in their own rounding), the same logged
    loss and metrics, and `peak_memory_gb` logged by the patched trainer only."""
    trainers = []
    for side in P.Sides._fields:
        with P.side_state(side, ALGO):
            extra = {"slimrl_num_chunks": 3} if side == "patched" else {}
            args = O.make_config(ALGO, str(tmp_path / side), max_steps=2, optim="sgd", **extra)
            trainer = P.finish_side(side, O.build_trainer(ALGO, P.side_model(side, lambda: T.tiny_model(0)), args))
            trainer.step_gradients = P.record_step_gradients(trainer)
            torch.manual_seed(3)
            trainer.train()
            trainers.append(trainer)
    keys = ("loss", "objective/kl", "objective/scores", "rewards/margins", "logps/chosen")
    HS.assert_trained_sides_match(P.Sides(*trainers), keys)


def test_lora_on_lm_head_runs_stock_path_with_a_warning(tmp_path, unpatched):
    """A LoRA-wrapped lm_head computes more than h @ W.T: the patched `_forward` warns and returns stock's numbers."""
    lora = T.lora_config(target_modules=["q_proj", "lm_head"])
    results = {}
    for side in ("stock", "patched"):
        with P.side_state(side, ALGO):
            args = O.make_config(ALGO, str(tmp_path))
            trainer = O.build_trainer(ALGO, T.tiny_model(0), args, lora)
            torch.manual_seed(1)
            if side == "patched":
                with pytest.warns(UserWarning, match="lm_head|output embedding"):
                    results[side] = float(trainer.training_step(trainer.model, O.batch_of(ALGO, trainer), None))
            else:
                results[side] = float(trainer.training_step(trainer.model, O.batch_of(ALGO, trainer), None))
    assert results["patched"] == results["stock"]


def test_judge_alias_gives_the_same_pairs_as_stock_reward(unpatched):
    """`PairwiseJudgeReward`: 1 for the preferred completion of each pair, 0 for the other, in TRL's layout."""
    from slimrl.patches.rollouts.judges import PairwiseJudgeReward

    reward = PairwiseJudgeReward(FirstWordJudge())
    prompts = ["p1", "p2"] * 2
    completions = ["a b c", "x", "a", "x y z"]  # pairs (a b c | a) -> first, (x | x y z) -> second
    assert reward(prompts=prompts, completions=completions) == [1.0, 0.0, 0.0, 1.0]
    assert reward.__name__ == "FirstWordJudge"
    conversational = [[{"role": "user", "content": "hi"}]] * 2
    assert reward(prompts=conversational, completions=[[{"role": "assistant", "content": "a b"}], "c"]) == [1.0, 0.0]
    copy.deepcopy(reward)  # the trainer deep-copies configs and callbacks; a reward must survive it
