"""Shared-prefix forwards (slimrl_shared_prefix) in the patched GRPO/RLOO trainers: parity with stock TRL, the path
really taken (positions counted), fallbacks with their reason logged once, the config field.

Parity cases run the sides of tests/patches/_parity.py with `slimrl_shared_prefix=True` on the patched side
only; stock TRL and the float64 sides run TRL's per-row forward. They cover every GRPO loss type, token and sequence
importance sampling, beta 0 and > 0 (adapter-disabled, "ref" adapter and reloaded reference), num_iterations 2
(old-policy forward), gradient accumulation with shuffled micro-batches, gradient checkpointing True / "offload",
slimrl_num_chunks, an entropy bonus, and RLOO; no case needs a tolerance of its own.
"""

import copy
import logging

import pytest
import torch

from slimrl.patches.scoring import shared_prefix as SP
from slimrl.patches.setup import shared_prefix_rules as rules
from slimrl.state import transformers_model
from slimrl.testing import tiny_llama, tiny_llama_config

import _parity as P
import _rl_parity as R
import _tiny as T
from _reference import naive_fused_lm_head, perturb_rounding

SHARE = {rules.CONFIG_FIELD: True}


def _run(algorithm, tmp_path, kind, saved_model, config, lora, chunks=None, checkpointing=None):
    trainers = R.build_case(
        algorithm, tmp_path, kind, saved_model, config, lora, checkpointing, num_chunks=chunks, patched_config=SHARE
    )
    if checkpointing is not None:
        from slimrl.models.checkpointing import is_checkpointing_active

        for side, trainer in zip(P.Sides._fields, trainers):
            assert is_checkpointing_active(trainer.model), side
    traces = R.run_sides(algorithm, trainers)
    R.assert_traces_match(traces)
    stats = SP.shared_prefix_stats(trainers.patched)
    assert stats.shared_calls > 0, f"the shared-prefix path was not taken: {stats}"
    assert stats.positions_forwarded < stats.positions_per_row_path, stats
    assert not SP.shared_prefix_stats(trainers.stock).shared_calls
    return trainers, traces, stats


@pytest.mark.parametrize("loss_type", R.LOSS_TYPES)
def test_grpo_loss_types_shared(tmp_path, unpatched, saved_model, loss_type):
    config = R.loss_type_config(loss_type, sequence_level=("luspo", "grpo"))  # GRPO's case covers GSPO
    trainers, traces, stats = _run("grpo", tmp_path, "memory", saved_model, config, lora=True, chunks=3)
    assert all("old_per_token_logps" in x and "ref_per_token_logps" in x for x in traces.stock.inputs)
    assert max(trainers.stock._metrics["train"]["kl"]) > 0
    assert stats.shared_calls >= 4 and not stats.fallback_calls  # policy x2, old-policy, reference


TARGETED = {
    # full fine-tuning, reference reloaded from disk, old log-probs (steps_per_generation 2 > accumulation 1):
    # micro-batches of 3 drawn from a shuffled 2 x 3 generation batch
    "full-ref-spg2": (
        "saved",
        False,
        None,
        None,
        dict(
            loss_type="dapo",
            beta=0.04,
            steps_per_generation=2,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=7,
        ),
    ),
    # no reference, accumulation with shuffled micro-batches, entropy bonus (gradient through entropies)
    "lora-beta0-ga2-entropybonus": (
        "memory",
        True,
        -1,
        None,
        dict(
            loss_type="dr_grpo",
            beta=0.0,
            entropy_coef=0.01,
            gradient_accumulation_steps=2,
            num_iterations=2,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=5,
        ),
    ),
    # user-wrapped PeftModel (frozen "ref" adapter), checkpointing on
    "peftmodel-refadapter-checkpointing": (
        "peft_model",
        False,
        1,
        True,
        dict(
            loss_type="bnpo",
            beta=0.04,
            gradient_checkpointing=True,
            num_iterations=2,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
        ),
    ),
    # full fine-tuning with offloaded checkpointing, sequence ratios, truncated completions masked
    "full-offload-seq-masktrunc": (
        "memory",
        False,
        3,
        "offload",
        dict(
            loss_type="grpo",
            importance_sampling_level="sequence",
            beta=0.0,
            num_iterations=2,
            gradient_checkpointing=True,
            mask_truncated_completions=True,
            per_device_train_batch_size=6,
            num_generations=3,
            max_completion_length=6,
        ),
    ),
}


@pytest.mark.parametrize("case", list(TARGETED))
def test_grpo_targeted_shared(tmp_path, unpatched, saved_model, case):
    kind, lora, chunks, checkpointing, config = TARGETED[case]
    _run("grpo", tmp_path, kind, saved_model, config, lora, chunks, checkpointing)


RLOO_CASES = {
    "lora-default-beta": ("memory", True, dict(per_device_train_batch_size=4, num_generations=2)),
    # full fine-tuning, reloaded reference, num_iterations 2, micro-batches of 3 from a shuffled 2 x 3 generation
    # batch: the old-policy forward packs other rows than the policy forward, so the first micro-step's ratio is not
    # exactly 1 as in stock (README.md, shared prefix, "Same numbers")
    "full-ref-ga2-iter2": (
        "saved",
        False,
        dict(num_iterations=2, gradient_accumulation_steps=2, per_device_train_batch_size=3, num_generations=3),
    ),
}


@pytest.mark.parametrize("case", list(RLOO_CASES))
def test_rloo_shared(tmp_path, unpatched, saved_model, case):
    kind, lora, config = RLOO_CASES[case]
    _run("rloo", tmp_path, kind, saved_model, config, lora)


def test_broken_sharing_fails_parity(tmp_path, unpatched, saved_model, leaky_sharing):
    """Negative control: completions that can see their siblings must fail the stock comparison."""
    with pytest.raises(AssertionError):
        _run("grpo", tmp_path, "memory", saved_model, dict(beta=0.0, num_iterations=2), lora=True)


def _patched_trainer(tmp_path, setting=True, **config):
    with P.patched_state("grpo"):
        args = R.make_config("grpo", str(tmp_path), **{rules.CONFIG_FIELD: setting}, **config)
        return R.build_trainer("grpo", T.tiny_model(0), args, T.lora_config())


def _rows(prompts, completion_len=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    completions = torch.randint(3, T.VOCAB, (len(prompts), completion_len), generator=g)
    return torch.cat([ids, completions], 1), torch.cat([mask, torch.ones_like(completions)], 1)


def _float64_copies(model):
    """The float64 sides of _parity (reference, then the perturbed draws): copies of `model` with the naive float64
    head, the perturbed ones with float32-sized rounding noise (tests/patches/_reference.py)."""
    copies = []
    for side in P.FLOAT64_SIDES:
        model64 = copy.deepcopy(model).to(torch.float64)
        naive_fused_lm_head(transformers_model(model64), outputs=("log_probs", "entropy"))
        if side in P.PERTURBATION_SEEDS:
            perturb_rounding(model64, P.PERTURBATION_SEEDS[side])
        copies.append(model64)
    return copies


def _check_against_trl(what, seam, original, trainer, *args, **kwargs):
    """`seam` vs TRL's `original` on the trainer's model and on its float64 copies, by _parity's rule."""
    got, stock = (f(trainer, trainer.model, *args, **kwargs) for f in (seam, original))
    reference, *perturbed = (original(trainer, m, *args, **kwargs) for m in _float64_copies(trainer.model))
    for i, name in enumerate(("log-probs", "entropies")):
        if stock[i] is not None:
            P.check(f"{what}: {name}", got[i], stock[i], reference[i], *(x[i] for x in perturbed))
    return got


def test_direct_calls_chunks_and_no_repeat_fallback(tmp_path, unpatched, caplog):
    """The seam called as TRL calls it: row chunks (`batch_size`) are shared inside each chunk; rows with no repeated
    prompt fall back with one logged reason; values equal TRL's own function."""
    trainer = _patched_trainer(tmp_path)
    original = type(trainer)._get_per_token_logps_and_entropies
    with P.patched_state("grpo"):
        patched = type(trainer)._get_per_token_logps_and_entropies
        assert patched.__slimrl_original__ is original
        a, b = [5, 6, 7, 8, 9, 10], [11, 12, 13]
        ids, mask = _rows([a, a, b, a, b, b])
        with caplog.at_level(logging.INFO, logger="slimrl"), torch.no_grad():
            got = _check_against_trl(
                "chunked", patched, original, trainer, ids, mask, 5, batch_size=3, compute_entropy=True
            )
            stats = SP.shared_prefix_stats(trainer)
            assert stats.shared_calls == 2 and got[2] is None
            distinct, distinct_mask = _rows([a, b, [4, 5]])
            for _ in range(2):
                patched(trainer, trainer.model, distinct, distinct_mask, 5)
            _check_against_trl("fallback", patched, original, trainer, distinct, distinct_mask, 5)
    reason = "no prompt is repeated among the rows of a forward"
    assert stats.reasons[reason] == 3
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


def test_model_problems_name_the_reason():
    from transformers import AutoConfig, AutoModelForCausalLM

    llama = T.tiny_model(0)
    assert rules.model_problem(llama, {}, 50, True) is None
    assert "multimodal" in rules.model_problem(llama, {"pixel_values": torch.zeros(1)}, 50, True)
    assert "aux loss" in rules.model_problem(llama, {"compute_aux_loss": True}, 50, True)
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=1, n_head=2))
    assert "not verified" in rules.model_problem(gpt2, {}, 50, True)
    mistral = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "mistral",
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=32,
        )
    )
    assert rules.model_problem(mistral, {}, 32, True) is None
    assert "sliding window" in rules.model_problem(mistral, {}, 33, True)
    llama.config._attn_implementation = "flash_attention_2"
    assert "attention implementation" in rules.model_problem(llama, {}, 50, True)
    dropout = tiny_llama(attention_dropout=0.1).train()
    assert rules.model_problem(dropout, {}, 50, True) is None
    assert "dropout" in rules.model_problem(dropout, {}, 50, rules.AUTO)
    assert rules.model_problem(dropout.eval(), {}, 50, rules.AUTO) is None


def test_auto_falls_back_under_dropout_and_matches_stock(tmp_path, unpatched, caplog):
    """'auto' with active dropout: TRL's path (same numbers as stock), the reason logged once."""
    with caplog.at_level(logging.INFO, logger="slimrl"):
        trainers = R.build_sides(
            "grpo",
            lambda: T.tiny_model(0, attention_dropout=0.3),
            dict(beta=0.0, disable_dropout=False, num_iterations=2),
            str(tmp_path),
        )
        R.assert_traces_match(R.run_sides("grpo", trainers))
    stats = SP.shared_prefix_stats(trainers.patched)
    assert stats.shared_calls == 0 and stats.fallback_calls >= 3
    assert sum("dropout is active" in r.getMessage() for r in caplog.records) == 1


def test_config_field(tmp_path, unpatched):
    with P.patched_state("grpo"):
        assert R.make_config("grpo", str(tmp_path)).slimrl_shared_prefix == rules.AUTO
        with pytest.raises(ValueError, match="slimrl_shared_prefix"):
            R.make_config("grpo", str(tmp_path), slimrl_shared_prefix="yes")
    with P.patched_state("rloo"):
        assert R.make_config("rloo", str(tmp_path), slimrl_shared_prefix=False).slimrl_shared_prefix is False
    trainer = _patched_trainer(tmp_path, setting=False, beta=0.0)
    ids, mask = _rows([[5, 6, 7]] * 4)
    with P.patched_state("grpo"), torch.no_grad():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 5)
    assert SP.shared_prefix_stats(trainer) == SP.SharedPrefixStats()


def test_auto_rule():
    """'auto' shares when prompts are long next to completions, not when completions dominate the rows, nor when
    the forward is tiny."""
    config = tiny_llama_config(hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536, num_layers=30)
    # 8 completions of 16 tokens after a 150-token prompt (the slimrl grpo recipe): packed 149 + 8 x 16 positions
    assert rules.estimated_cost_ratio(config, 8, 166, 1, 149 + 8 * 16) < 0.3
    assert rules.auto_refusal(config, 8, 166, 1, 149 + 8 * 16) is None
    # 8 completions of 1024 tokens after a 16-token prompt: the dense packed row costs more than it saves
    assert "ratio" in rules.auto_refusal(config, 8, 1040, 1, 15 + 8 * 1024)
    tiny = T.tiny_model(0).config  # the parity suites' model: 2 x 32
    assert "FLOPs" in rules.auto_refusal(tiny, 4, 15, 2, 12)
