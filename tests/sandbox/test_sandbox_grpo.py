"""A patched GRPO run whose reward runs "model-written" code through the sandbox: completions stand for escapes,
crashes, a hang and a 10 GB allocation; every one is scored as a failure and the run finishes its steps."""

import math

from slimrl import PatchFastRL, check_python_modules, create_locked_down_function

from _games import COMPLETIONS, Game2048, play

CODES = list(COMPLETIONS.values())
SCORES = {"plays": 2.0, "refused": -20.0, "timeout": -1.0, "crash": -3.0, "unparsable": -2.0}


def strategy_reward(completions, **kwargs):
    """Scores the i-th code of COMPLETIONS for the i-th completion (a random tiny model writes no code)."""
    scores = []
    for index, _ in enumerate(completions):
        code = CODES[(index + strategy_reward.calls) % len(CODES)]
        ok, info = check_python_modules(code)
        if "error" in info or not ok:
            scores.append(SCORES["unparsable" if "error" in info else "refused"])
            continue
        strategy = create_locked_down_function(code, time_limit=0.3, memory_mb=256)
        try:
            play(strategy, Game2048(seed=index, target=8))
            scores.append(SCORES["plays"])
        except TimeoutError:
            scores.append(SCORES["timeout"])
        except Exception:
            scores.append(SCORES["crash"])
    strategy_reward.calls += 1
    strategy_reward.seen.extend(scores)
    return scores


strategy_reward.calls, strategy_reward.seen = 0, []


def test_grpo_steps_go_on_through_every_failure(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import _tiny as T

    PatchFastRL("grpo")
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, num_generations=8,
        max_completion_length=6, report_to="none", logging_steps=1, save_strategy="no", use_cpu=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=T.tiny_model(),
        reward_funcs=strategy_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": T.PROMPTS[:4]}),
        processing_class=T.tokenizer(),
        peft_config=T.lora_config(),
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert set(strategy_reward.seen) == set(SCORES.values())  # every kind of outcome happened
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)
