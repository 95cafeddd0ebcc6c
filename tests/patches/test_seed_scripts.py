"""The seed scripts as Unsloth users write them run unchanged after the import swap (tiny model in place of the Hub id,
4-bit and vLLM off on CPU): each example of the PatchFastRL pages, then each accepted alias and each refusal on its own.

1. GRPO with `GRPOConfig(..., max_new_tokens=...)` and `def reward_fn(completions, prompts)` trains.
2. DPO with `DPOTrainer(model=..., args=..., train_dataset=..., tokenizer=tokenizer)` trains.
3. GRPO with `per_device_train_batch_size=1, gradient_accumulation_steps=4, num_generations=8` and no
   `processing_class` trains (the generation batch fitted, the tokenizer from_pretrained returned used).
4. Mode switching (for_inference / generate / for_training / backward) and `PatchFastRL()` / `PatchFastRL(None, ...)`.
(PPO's seed example is tested with the PPO trainer, tests/ppo/test_trainer.py.)
"""

import pytest
import torch
from datasets import Dataset

import slimrl
from slimrl import FastLanguageModel, PatchFastRL, notices

import _tiny as T


@pytest.fixture
def fresh_notices():
    notices._said.clear()  # each notice prints once per process; each test sees its own
    yield


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return T.save_tiny(str(tmp_path_factory.mktemp("seed-model")))


def _lora_model(tiny_dir):
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_dir, max_seq_length=256, dtype=torch.float32)
    return FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing=False), tokenizer


def _prompts(n=8):
    return Dataset.from_dict({"prompt": [T.PROMPTS[i % len(T.PROMPTS)] for i in range(n)]})


def reward_fn(completions, prompts):  # the seed's signature: two of the keywords TRL passes, in its own order
    return [float(len(c) % 5) - 0.1 * len(p) for c, p in zip(completions, prompts)]


def _small(**extra):
    return dict(max_steps=1, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", **extra)


def test_grpo_seed_max_new_tokens_and_two_argument_reward(tiny_dir, tmp_path, unpatched, fresh_notices, caplog):
    model, tokenizer = _lora_model(tiny_dir)
    PatchFastRL("grpo", FastLanguageModel)
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), max_new_tokens=6, per_device_train_batch_size=4, num_generations=4, **_small()
    )
    assert args.max_completion_length == 6
    assert "GRPOConfig(max_new_tokens=...) is TRL 1.16's max_completion_length" in caplog.text
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward_fn], args=args, train_dataset=_prompts(), processing_class=tokenizer
    )
    trainer.train()
    assert [h for h in trainer.state.log_history if "rewards/reward_fn/mean" in h], "the reward ran, under its name"


def test_dpo_seed_tokenizer_keyword(tiny_dir, tmp_path, unpatched, fresh_notices, caplog):
    model, tokenizer = _lora_model(tiny_dir)
    PatchFastRL("dpo", FastLanguageModel)
    from trl import DPOConfig, DPOTrainer

    data = Dataset.from_dict({"prompt": T.PROMPTS[:4], "chosen": [" yes"] * 4, "rejected": [" no no"] * 4})
    trainer = DPOTrainer(
        model=model,
        args=DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, **_small()),
        train_dataset=data,
        tokenizer=tokenizer,
    )
    assert trainer.processing_class is tokenizer
    assert "DPOTrainer(tokenizer=...) is TRL 1.16's processing_class" in caplog.text
    trainer.train()


def test_grpo_seed_batch_one_accumulation_four_eight_generations_no_processing_class(
    tiny_dir, tmp_path, unpatched, fresh_notices, caplog
):
    model, tokenizer = _lora_model(tiny_dir)
    PatchFastRL("grpo", FastLanguageModel)
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
        num_generations=8,
        max_completion_length=4,
        **_small(),
    )
    # the micro-batch and accumulation stay (per-step memory as configured); the generation batch holds 8
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (1, 4)
    assert (args.steps_per_generation, args.generation_batch_size) == (8, 8)
    assert "steps_per_generation 4 -> 8, generation batch 4 -> 8" in caplog.text
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=_prompts())
    assert trainer.processing_class is tokenizer, "the tokenizer from_pretrained returned, not a reload by name"
    trainer.train()
    assert trainer.state.global_step == 1


def test_mode_switching_seed(tiny_dir, unpatched):
    model, tokenizer = _lora_model(tiny_dir)
    FastLanguageModel.for_inference(model)
    ids = tokenizer(["hello world"], return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    FastLanguageModel.for_training(model)
    loss = model(input_ids=out, labels=out).loss
    loss.backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("call", [lambda: PatchFastRL(), lambda: PatchFastRL(None, FastLanguageModel)])
def test_patch_everything(call, unpatched):
    assert call() == slimrl.patches.registry.supported_algorithms()


# --- each alias and refusal on its own --------------------------------------------------------------------------


def _trainer_kwargs(algorithm, tokenizer):
    import _orpo_cpo_parity as O
    import _pref_parity as H
    import _rl_parity as R

    # LoRA where a reference is built (DPO, KTO, RLOO's beta=0.05): the adapter-disabled base, as a full model would
    # be reloaded by its name
    lora = {"peft_config": T.lora_config()} if algorithm in ("dpo", "kto", "rloo") else {}
    if algorithm in ("grpo", "rloo"):
        return R.trl_classes(algorithm), dict(reward_funcs=R.reward_ids, train_dataset=R.dataset(), **lora)
    if algorithm in ("orpo", "cpo"):
        return O.trl_classes(algorithm), dict(train_dataset=O.dataset())
    return H.trl_classes(algorithm), dict(train_dataset=H.dataset(H.DATA_KIND[algorithm]), **lora)


ALL = ["grpo", "rloo", "dpo", "kto", "sft", "reward", "orpo", "cpo"]


@pytest.mark.parametrize("algorithm", ALL)
def test_tokenizer_is_accepted_by_every_patched_trainer(algorithm, tmp_path, unpatched):
    import _pref_parity as H

    tokenizer = T.tokenizer()
    PatchFastRL(algorithm)
    (config_cls, trainer_cls), kwargs = _trainer_kwargs(algorithm, tokenizer)
    model = H.tiny_reward_model() if algorithm == "reward" else T.tiny_model()
    args = config_cls(
        output_dir=str(tmp_path),
        report_to="none",
        per_device_train_batch_size=2,
        **({"num_generations": 2} if algorithm in ("grpo", "rloo") else {}),
    )
    trainer = trainer_cls(model=model, args=args, tokenizer=tokenizer, **kwargs)
    assert trainer.processing_class is tokenizer
    with pytest.raises(ValueError, match=r"both tokenizer=\w+ and processing_class=\w+: tokenizer is the older"):
        trainer_cls(model=model, args=args, tokenizer=tokenizer, processing_class=T.tokenizer(), **kwargs)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_max_new_tokens_conflicting_with_max_completion_length_names_both(algorithm, tmp_path, unpatched):
    import _rl_parity as R

    PatchFastRL(algorithm)
    config_cls, _ = R.trl_classes(algorithm)
    assert config_cls(output_dir=str(tmp_path), max_new_tokens=32, max_completion_length=32).max_completion_length == 32
    with pytest.raises(ValueError, match=r"both max_new_tokens=16 and max_completion_length=32"):
        config_cls(output_dir=str(tmp_path), max_new_tokens=16, max_completion_length=32)


def test_sft_max_seq_length_is_max_length(tmp_path, unpatched):
    PatchFastRL("sft")
    from trl import SFTConfig

    assert SFTConfig(output_dir=str(tmp_path), max_seq_length=64).max_length == 64


@pytest.mark.parametrize(
    "algorithm, field, says",
    [
        ("kto", "max_prompt_length", "truncated together by max_length"),
        ("dpo", "max_target_length", "truncated together by max_length"),
        ("orpo", "max_target_length", "truncated together by max_length"),
    ],
)
def test_removed_fields_say_what_replaced_them(algorithm, field, says, tmp_path, unpatched):
    import _orpo_cpo_parity as O
    import _pref_parity as H
    import _rl_parity as R

    PatchFastRL(algorithm)
    config_cls = {
        **{a: R.trl_classes(a)[0] for a in ("grpo", "rloo")},
        "dpo": H.trl_classes("dpo")[0],
        "kto": H.trl_classes("kto")[0],
        "orpo": O.trl_classes("orpo")[0],
    }[algorithm]
    with pytest.raises(TypeError, match=rf"TRL 1.16 removed {field}\. .*{says}"):
        config_cls(output_dir=str(tmp_path), **{field: 128})


@pytest.mark.parametrize(
    "name, nearest",
    [
        ("bco", "'kto'"),
        ("xpo", "'dpo'"),
        ("prm", "'reward'"),
        ("nash_md", "'grpo'"),
    ],
)
def test_algorithms_trl_removed_name_the_nearest(name, nearest, unpatched):
    with pytest.raises(ValueError, match=rf"{nearest}.*Supported: a2po, cpo, distillation, dpo, gkd, gmpo, gold, grpo"):
        PatchFastRL(name)
    assert not slimrl.is_patched()


@pytest.mark.parametrize("name", ["online_dpo", "gkd"])
def test_trainers_trl_keeps_in_experimental_are_patched_not_refused(name, unpatched):
    """TRL 1.16 still ships online DPO and GKD under trl.experimental, and slimrl patches them."""
    assert PatchFastRL(name) == [name]


def test_reward_needing_a_missing_column_fails_before_training(tiny_dir, tmp_path, unpatched):
    model, tokenizer = _lora_model(tiny_dir)
    PatchFastRL("grpo")
    from trl import GRPOConfig, GRPOTrainer

    def correctness(completions, solution):
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, **_small())
    with pytest.raises(ValueError, match=r"'correctness' requires the parameter 'solution'.*\['prompt'\]"):
        GRPOTrainer(
            model=model, reward_funcs=[correctness], args=args, train_dataset=_prompts(), processing_class=tokenizer
        )
