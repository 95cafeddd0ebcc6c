"""slimrl's PPOTrainer on tiny models: it learns, the seed's call shape, early errors, one model body (the reference
is the adapter-disabled base), both adapters and the head train with the right adapter in each forward, full-model
policies, reward/value models, PatchFastRL("ppo"), and no [B, T, V] logits."""

import gc

import pytest
import torch

from slimrl.ppo import PPOConfig, PPOTrainer

from _harness import largest_allocation  # tests/patches/_harness.py, on pytest's pythonpath
from _ppo_helpers import (
    VOCAB,
    logged,
    lora_config,
    lora_trainer,
    low_id_reward,
    ppo_config,
    prompts,
    tiny_policy,
    tokenizer,
)


def _mean(xs):
    return sum(xs) / len(xs)


def test_a_few_ppo_steps_raise_a_simple_reward(tmp_path):
    # kl_coef=0: the tiny model's distribution moves fast, and a KL penalty would hold the reward back in 10 rollouts
    trainer = lora_trainer(tmp_path, per_device_train_batch_size=16, max_steps=20, kl_coef=0.0)
    trainer.train()
    scores = logged(trainer, "objective/scores")
    assert len(scores) == 10  # 20 optimizer steps / 2 PPO epochs per rollout
    assert _mean(scores[-3:]) > _mean(scores[:2]) + 0.3, scores
    # negative control: the same run without a usable step does not rise
    still = lora_trainer(
        tmp_path / "still", per_device_train_batch_size=16, max_steps=20, kl_coef=0.0, learning_rate=1e-7
    )
    still.train()
    flat = logged(still, "objective/scores")
    assert abs(_mean(flat[-3:]) - _mean(flat[:2])) < 0.15, flat


def test_the_seed_call_shape_builds_and_train_names_what_is_missing(tmp_path, caplog):
    config = ppo_config(tmp_path)
    model, tok = tiny_policy(), tokenizer()
    with caplog.at_level("WARNING", logger="slimrl"):
        trainer = PPOTrainer(model=model, config=config, tokenizer=tok)
    assert trainer.args is config and trainer.processing_class is tok
    notices = [r.getMessage() for r in caplog.records if "PPOTrainer(" in r.getMessage()]
    assert len(notices) == 2 and "(config=...)" in notices[0] and "(tokenizer=...)" in notices[1], notices
    model.generate = None  # train() must fail before any rollout
    with pytest.raises(ValueError) as err:
        trainer.train()
    assert "reward_model=" in str(err.value) and "reward_funcs=" in str(err.value)
    assert "train_dataset=" in str(err.value)
    with pytest.raises(ValueError, match=r"reward source") as err:
        PPOTrainer(model=tiny_policy(), config=config, tokenizer=tok, train_dataset=prompts()).train()
    assert "train_dataset" not in str(err.value)
    with pytest.raises(ValueError, match=r"both config=.* and args=.*older name of args"):
        PPOTrainer(args=ppo_config(tmp_path, kl_coef=0.1), config=config, model=tiny_policy(), tokenizer=tok)
    with pytest.raises(ValueError, match=r"both tokenizer=.* and processing_class="):
        PPOTrainer(args=config, model=tiny_policy(), processing_class=tok, tokenizer=tokenizer())
    with pytest.raises(TypeError, match=r"only works by keyword"):  # TRL's older positional order
        PPOTrainer(config, tiny_policy(), None, tok)


def test_too_small_a_dataset_fails_before_any_rollout(tmp_path):
    trainer = PPOTrainer(
        args=ppo_config(tmp_path, per_device_train_batch_size=8, num_mini_batches=2),
        processing_class=tokenizer(),
        model=tiny_policy(),
        reward_funcs=[low_id_reward],
        train_dataset=prompts(12),
        peft_config=lora_config(),
    )
    with pytest.raises(ValueError, match=r"12 rows, fewer than one rollout \(16"):
        trainer.train()


def test_a_lora_on_the_output_layer_is_refused(tmp_path):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="lm_head"):
        PPOTrainer(
            args=ppo_config(tmp_path),
            processing_class=tokenizer(),
            model=tiny_policy(),
            reward_funcs=low_id_reward,
            peft_config=LoraConfig(r=4, target_modules=["q_proj", "lm_head"]),
        )


def _full_logprobs(model, input_ids, attention_mask, context_length):
    """Log-probs of the response tokens from full logits (the slow, independent way)."""
    from slimrl.ppo.value import position_ids_of

    logits = (
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_of(attention_mask))
        .logits[:, context_length - 1 : -1]
        .float()
    )
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, context_length:, None]).squeeze(-1)


def _live_llamas():
    from transformers import LlamaForCausalLM

    return [o for o in gc.get_objects() if isinstance(o, LlamaForCausalLM)]


def test_the_reference_is_the_adapter_disabled_base_with_no_second_model(tmp_path):
    gc.collect()
    already = len(_live_llamas())
    trainer = lora_trainer(tmp_path, max_steps=3)  # 1.5 rollouts: the adapter has moved when rollout 2 runs
    assert trainer.ppo.reference is trainer.model and trainer.ppo.reference_adapters_off
    gc.collect()
    assert len(_live_llamas()) == already + 1, "a second model body was built"
    trainer.train()
    batch = trainer._buffer
    mask = batch.response_mask.bool()
    model = trainer.model
    with torch.no_grad():
        with model.disable_adapter():
            base = _full_logprobs(model, batch.input_ids, batch.attention_mask, batch.context_length)
        adapted = _full_logprobs(model, batch.input_ids, batch.attention_mask, batch.context_length)
        with trainer.ppo.reference_context():
            from slimrl.ppo.models import response_logprobs

            ref = response_logprobs(trainer.ppo.reference, batch.input_ids, batch.attention_mask, batch.context_length)[
                0
            ]
    torch.testing.assert_close(ref[mask], base[mask], rtol=1e-5, atol=1e-5)
    assert (adapted[mask] - base[mask]).abs().max() > 1e-3, "the adapter should have moved the policy"


def test_both_adapters_and_the_head_train_and_each_forward_uses_its_adapter(tmp_path):
    trainer = lora_trainer(tmp_path, max_steps=2)  # LoRA A gets no gradient while B is still 0 (step 1)
    model = trainer.model
    named = dict(model.named_parameters())
    policy = {n: p.detach().clone() for n, p in named.items() if ".default." in n and "lora_" in n}
    value = {n: p.detach().clone() for n, p in named.items() if ".value." in n and "lora_" in n}
    frozen = {n: p.detach().clone() for n, p in named.items() if "lora_" not in n}
    head = {n: p.detach().clone() for n, p in trainer.ppo.critic.head.named_parameters()}
    assert policy and value and len(policy) == len(value)
    trainer.train()
    named = dict(model.named_parameters())
    for group, label in ((policy, "policy adapter"), (value, "value adapter")):
        moved = [n for n, before in group.items() if not torch.equal(named[n].detach(), before)]
        assert len(moved) == len(group), f"{label}: only {len(moved)}/{len(group)} tensors changed"
        assert all(named[n].requires_grad for n in group), label
    assert all(torch.equal(named[n].detach(), before) for n, before in frozen.items())
    assert all(not torch.equal(p.detach(), head[n]) for n, p in trainer.ppo.critic.head.named_parameters())
    assert model.active_adapter == "default"
    # each forward uses its own adapter: compare with forwards made by hand under an explicit set_adapter
    batch = trainer._buffer
    ids, mask, ctx = batch.input_ids, batch.attention_mask, batch.context_length
    from slimrl.ppo.models import response_logprobs, response_values
    from slimrl.ppo.value import position_ids_of

    with torch.no_grad():
        with trainer.ppo.critic.active():
            values = response_values(trainer.ppo.critic, ids, mask, ctx)
        policy_logprobs = response_logprobs(model, ids, mask, ctx)[0]
        model.set_adapter("value")
        hidden = (
            model.get_base_model()
            .model(input_ids=ids, attention_mask=mask, position_ids=position_ids_of(mask))
            .last_hidden_state
        )
        by_hand_values = trainer.ppo.critic.head(hidden)[:, ctx - 1 : -1]
        value_adapter_logprobs = _full_logprobs(model, ids, mask, ctx)
        model.set_adapter("default")
        by_hand_logprobs = _full_logprobs(model, ids, mask, ctx)
    real = batch.response_mask.bool()
    torch.testing.assert_close(values, by_hand_values)
    torch.testing.assert_close(policy_logprobs[real], by_hand_logprobs[real], rtol=1e-5, atol=1e-5)
    assert (value_adapter_logprobs[real] - by_hand_logprobs[real]).abs().max() > 1e-3


def test_gradient_checkpointing_gives_the_same_steps(tmp_path):
    """Under checkpointing the backward recomputes each forward: it must see the adapter that forward used."""
    runs = []
    for checkpointing in (False, True):
        trainer = lora_trainer(tmp_path / str(checkpointing), max_steps=2, gradient_checkpointing=checkpointing)
        trainer.train()
        state = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        runs.append(
            (
                logged(trainer, "loss/value_avg") + logged(trainer, "loss/policy_avg"),
                state,
                trainer.model.get_base_model().model.gradient_checkpointing,
            )
        )
    (losses_off, state_off, on_off), (losses_on, state_on, on_on) = runs
    assert on_on and not on_off
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-5, atol=1e-6)
    for name, tensor in state_off.items():
        torch.testing.assert_close(state_on[name], tensor, rtol=1e-4, atol=1e-6)


def test_a_full_model_policy_trains_against_a_frozen_copy_that_carries_the_value_adapter(tmp_path):
    model = tiny_policy()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = PPOTrainer(
        args=ppo_config(tmp_path, learning_rate=1e-3),
        processing_class=tokenizer(),
        model=model,
        reward_model=low_id_reward,
        train_dataset=prompts(),
    )
    reference = trainer.ppo.reference.get_base_model()
    assert trainer.model is model and reference is not model and trainer.ppo.reference_adapters_off
    trainer.train()
    assert all(not torch.equal(p.detach(), start[n]) for n, p in model.named_parameters())
    frozen = {n: p for n, p in reference.named_parameters() if "lora_" not in n}
    assert all(
        not p.requires_grad and torch.equal(p.detach(), start[n.replace(".base_layer", "")]) for n, p in frozen.items()
    )
    moved = [p for n, p in reference.named_parameters() if "lora_B" in n]
    assert moved and all(p.abs().sum() > 0 for p in moved), "the value adapter on the copy did not train"


def test_a_reward_model_and_a_value_model_can_be_passed(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from slimrl.testing import tiny_llama_config

    def seq_cls(seed):
        torch.manual_seed(seed)
        config = tiny_llama_config(vocab_size=VOCAB, num_labels=1)
        return AutoModelForSequenceClassification.from_config(config)

    reward_model, value_model = seq_cls(3), seq_cls(4)
    reward_before = {n: p.detach().clone() for n, p in reward_model.named_parameters()}
    value_before = {n: p.detach().clone() for n, p in value_model.named_parameters()}
    trainer = PPOTrainer(
        args=ppo_config(tmp_path),
        processing_class=tokenizer(),
        model=tiny_policy(),
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=prompts(),
        peft_config=lora_config(),
    )
    assert "value" not in trainer.model.peft_config  # a value model given: no value adapter
    trainer.train()
    scores = logged(trainer, "objective/scores")
    assert scores and all(s != 0 for s in scores)
    assert all(torch.equal(p, reward_before[n]) for n, p in reward_model.named_parameters())
    assert any(not torch.equal(p.detach(), value_before[n]) for n, p in value_model.named_parameters())


def test_patchfastrl_ppo_adds_the_trl_names_and_unpatch_removes_them():
    import trl

    import slimrl

    assert not hasattr(trl, "PPOTrainer")
    assert slimrl.PatchFastRL("ppo", slimrl.FastLanguageModel) == ["ppo"]
    from trl import PPOConfig as TrlPPOConfig
    from trl import PPOTrainer as TrlPPOTrainer

    assert TrlPPOTrainer is PPOTrainer is slimrl.PPOTrainer and TrlPPOConfig is PPOConfig is slimrl.PPOConfig
    slimrl.unpatch("ppo")
    assert not hasattr(trl, "PPOTrainer") and not hasattr(trl, "PPOConfig")
    with pytest.raises(ImportError):
        from trl import PPOTrainer as _gone  # noqa: F401


def test_config_checks_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="kl_estimator"):
        ppo_config(tmp_path, kl_estimator="k2")
    with pytest.raises(ValueError, match="stop_token and stop_token_id"):
        ppo_config(tmp_path, stop_token="eos", stop_token_id=3)
    with pytest.raises(ValueError, match="missing_eos_penalty"):
        ppo_config(tmp_path, missing_eos_penalty=-1.0)
    with pytest.raises(ValueError, match="no evaluation loop"):
        ppo_config(tmp_path, eval_strategy="steps")
    args = ppo_config(tmp_path, total_episodes=40, max_steps=-1, num_mini_batches=2)
    assert args.batch_size == 16 and args.max_steps == 3 * 2 * 2  # ceil(40 / 16) rollouts x 2 epochs x 2 mini-batches
    with pytest.raises(ValueError, match="total_episodes=40 means 12 optimizer steps.*max_steps=5"):
        ppo_config(tmp_path, total_episodes=40, max_steps=5, num_mini_batches=2)
    assert isinstance(args, PPOConfig) and args.max_completion_length == args.response_length


CHUNKED_VOCAB = 4096  # B x C x V (8 x 8 x 4096 = 262k) dwarfs every weight (V x H = 131k) and activation


def _step_peak(tmp_path, num_chunks: int) -> tuple[int, int, int, int]:
    """(largest new tensor of one PPO step, rollout included; rows; response columns; full row width)."""
    from slimrl.testing import tiny_llama, tiny_tokenizer

    trainer = PPOTrainer(
        args=ppo_config(tmp_path, max_steps=1, response_length=8, slimrl_num_chunks=num_chunks),
        processing_class=tiny_tokenizer(CHUNKED_VOCAB),
        model=tiny_llama(vocab_size=CHUNKED_VOCAB),
        reward_model=low_id_reward,
        train_dataset=prompts(),
        peft_config=lora_config(),
    )
    largest = largest_allocation(trainer.train)
    batch = trainer._buffer
    return largest, batch.input_ids.shape[0], batch.response_mask.shape[1], batch.input_ids.shape[1]


def test_no_tensor_of_batch_x_length_x_vocab_is_allocated(tmp_path):
    """Every log-prob goes through the lean head, in row chunks of the response tokens: with 4 chunks the largest new
    tensor of a PPO step (rollout included) is one chunk's logits, a quarter of the response's [B, C, V], and no
    [B, C, V] (let alone [B, T, V]) tensor exists. Controls: one chunk allocates the response's [B, C, V] logits (the
    recorder sees them when they exist), and a plain forward allocates [B, T, V]."""
    from slimrl.testing import tiny_llama

    largest, rows, response, width = _step_peak(tmp_path / "chunked", num_chunks=4)
    response_logits = rows * response * CHUNKED_VOCAB
    assert largest <= -(-rows * response // 4) * CHUNKED_VOCAB < response_logits, (largest, rows, response)
    unchunked, *_ = _step_peak(tmp_path / "one-chunk", num_chunks=1)
    assert unchunked >= response_logits, (unchunked, response_logits)
    model, ids = tiny_llama(vocab_size=CHUNKED_VOCAB), torch.randint(3, CHUNKED_VOCAB, (rows, width))
    with torch.no_grad():
        full = largest_allocation(lambda: model(input_ids=ids))
    assert full >= rows * width * CHUNKED_VOCAB > response_logits
