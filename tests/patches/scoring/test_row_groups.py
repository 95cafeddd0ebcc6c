"""Row groups, padding-free forwards and the tiled MLP in the patched GRPO/RLOO trainers: parity with stock TRL, the
paths really taken (counted), fallbacks with their reason logged once, the config fields.

Parity cases run the sides of tests/patches/_parity.py with slimrl's long-context fields on the patched side only;
stock TRL and the float64 sides score every micro-batch in one forward. They cover every GRPO loss type, token and
sequence importance sampling, beta 0 and > 0 (adapter-disabled, "ref" adapter and reloaded reference), num_iterations
2 (old-policy forward), steps_per_generation > accumulation, gradient accumulation, an entropy bonus with TRL's
adaptive controller, gradient checkpointing True / "offload", shared-prefix forwards, and RLOO. Negative controls:
groups that forget the rows already scored, an earlier group's backward scaled by 1.01, and a padding-free forward
whose outputs land one column off each fail the comparison. The default tier runs every loss type, the controls and
one targeted GRPO and RLOO case each; the other combinations are `slow`.
"""

import logging

import pytest
import torch

from slimrl.models.tiled_mlp import TILED_MLP_FIELD, tiled_mlp_state
from slimrl.ops.row_groups import ROWS_FIELD
from slimrl.patches.scoring import padding_free as PF
from slimrl.patches.scoring import row_groups as RG
from slimrl.patches.scoring import shared_prefix as SP
from slimrl.patches.setup import row_groups_rules as rules

import _parity as P
import _rl_parity as R
import _tiny as T


def _run(algorithm, tmp_path, kind, saved_model, config, lora, patched, checkpointing=None):
    trainers = R.build_case(algorithm, tmp_path, kind, saved_model, config, lora, checkpointing, patched_config=patched)
    traces = R.run_sides(algorithm, trainers)
    R.assert_traces_match(traces)
    return trainers, traces


def _assert_grouped(trainer):
    stats = RG.row_group_stats(trainer)
    assert stats.grouped_steps > 0 and stats.groups > stats.grouped_steps, stats
    return stats


def _assert_trimmed(trainer):
    stats = PF.padding_free_stats(trainer)
    assert stats.trimmed_calls > 0 and stats.positions_forwarded < stats.positions_padded, stats


@pytest.mark.parametrize("loss_type", R.LOSS_TYPES)
def test_grpo_loss_types_one_row_per_group(tmp_path, unpatched, saved_model, loss_type):
    """Each row its own group (its own graph and backward) and its own padding-free forward."""
    config = R.loss_type_config(loss_type, sequence_level=("luspo", "grpo"))
    trainers, traces = _run("grpo", tmp_path, "memory", saved_model, config, True, {ROWS_FIELD: 1})
    stats = _assert_grouped(trainers.patched)
    assert stats.groups == 4 * stats.grouped_steps and stats.grouped_passes >= 2  # old-policy and reference passes
    assert all("old_per_token_logps" in x and "ref_per_token_logps" in x for x in traces.stock.inputs)
    _assert_trimmed(trainers.patched)


TARGETED = {
    # full fine-tuning, reference reloaded from disk (its own tiled MLPs), old log-probs from spg 2 > accumulation 1
    "full-ref-spg2-rows2-tiled": (
        "saved",
        False,
        None,
        dict(loss_type="dapo", beta=0.04, steps_per_generation=2, per_device_train_batch_size=3, num_generations=3),
        {ROWS_FIELD: 2, TILED_MLP_FIELD: 3},
    ),
    # entropy bonus through TRL's adaptive controller, accumulation with shuffled micro-batches, reuse
    "lora-adaptive-entropy-ga2-iters2-rows1": (
        "memory",
        True,
        None,
        dict(
            loss_type="dr_grpo",
            beta=0.0,
            entropy_coef=0.01,
            use_adaptive_entropy=True,
            entropy_target=3.0,
            gradient_accumulation_steps=2,
            num_iterations=2,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=5,
        ),
        {ROWS_FIELD: 1},
    ),
    # user-wrapped PeftModel ("ref" adapter), checkpointing, tiled MLP in the recompute, shared prefixes per group
    "peftmodel-checkpointing-tiled-shared-rows2": (
        "peft_model",
        False,
        True,
        dict(loss_type="bnpo", beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=4),
        {ROWS_FIELD: 2, TILED_MLP_FIELD: 2, SP.CONFIG_FIELD: True},
    ),
    # full fine-tuning, offloaded checkpointing, sequence ratios, two-sided clip, temperature, truncation masked
    "full-offload-seq-delta-masktrunc-rows3": (
        "memory",
        False,
        "offload",
        dict(
            loss_type="grpo",
            importance_sampling_level="sequence",
            delta=1.5,
            temperature=0.7,
            mask_truncated_completions=True,
            num_iterations=2,
            per_device_train_batch_size=6,
            num_generations=3,
            max_completion_length=6,
        ),
        {ROWS_FIELD: 3, TILED_MLP_FIELD: 4},
    ),
    # CISPO without checkpointing, tiled MLP in the plain forward (LoRA on gate_proj), padding-free off
    "lora-cispo-tiled-no-padding-free": (
        "memory",
        True,
        None,
        dict(loss_type="cispo", epsilon_high=3.0, num_iterations=2, per_device_train_batch_size=4, num_generations=2),
        {ROWS_FIELD: 1, TILED_MLP_FIELD: 2, rules.PADDING_FREE_FIELD: False},
    ),
}


DEFAULT_TIER = {"peftmodel-checkpointing-tiled-shared-rows2", "lora-ga2-iter2-rows2-shared"}  # the rest: -m slow


def _cases(table):
    return [pytest.param(case, marks=() if case in DEFAULT_TIER else pytest.mark.slow) for case in table]


@pytest.mark.parametrize("case", _cases(TARGETED))
def test_grpo_targeted(tmp_path, unpatched, saved_model, case):
    kind, lora, checkpointing, config, patched = TARGETED[case]
    trainers, _ = _run("grpo", tmp_path, kind, saved_model, config, lora, patched, checkpointing)
    _assert_grouped(trainers.patched)
    if patched.get(TILED_MLP_FIELD):
        state = tiled_mlp_state(trainers.patched.model)
        assert state.tiled_calls > 0 and state.sharded_calls > 0, state
        if kind == "saved":
            assert tiled_mlp_state(trainers.patched.ref_model).sharded_calls > 0
    if patched.get(SP.CONFIG_FIELD):
        assert SP.shared_prefix_stats(trainers.patched).shared_calls > 0
    if patched.get(rules.PADDING_FREE_FIELD) is False:
        assert PF.padding_free_stats(trainers.patched).positions_padded == 0
    if config.get("use_adaptive_entropy"):
        assert trainers.stock.entropy_coef == trainers.patched.entropy_coef != 0.01  # the controller moved once a step


RLOO_CASES = {
    "lora-default-beta-rows1-tiled": (True, dict(per_device_train_batch_size=4, num_generations=2), {"tiled": 3}),
    "lora-ga2-iter2-rows2-shared": (
        True,
        dict(num_iterations=2, gradient_accumulation_steps=2, per_device_train_batch_size=3, num_generations=3),
        {SP.CONFIG_FIELD: True},
    ),
}


@pytest.mark.parametrize("case", _cases(RLOO_CASES))
def test_rloo(tmp_path, unpatched, saved_model, case):
    lora, config, extra = RLOO_CASES[case]
    patched = {ROWS_FIELD: 1 if "rows1" in case else 2, **extra}
    if "tiled" in patched:
        patched[TILED_MLP_FIELD] = patched.pop("tiled")
    trainers, _ = _run("rloo", tmp_path, "memory", saved_model, config, lora, patched)
    _assert_grouped(trainers.patched)


def _control_run(tmp_path, saved_model):
    config = dict(loss_type="grpo", beta=0.04, num_iterations=2, per_device_train_batch_size=4, num_generations=2)
    return _run("grpo", tmp_path, "memory", saved_model, config, True, {ROWS_FIELD: 2})


def test_control_forgotten_rows_fail_parity(tmp_path, unpatched, saved_model, monkeypatch):
    """Negative control: the last group's loss computed with placeholders for the rows scored before it."""
    real = RG.RowSelection.assemble

    def forgetting(self, index, live):
        self.values[index] = None
        return real(self, index, live)

    monkeypatch.setattr(RG.RowSelection, "assemble", forgetting)
    with pytest.raises(AssertionError):
        _control_run(tmp_path, saved_model)


def test_control_misscaled_group_backward_fails_parity(tmp_path, unpatched, saved_model, monkeypatch):
    """Negative control: an earlier group's backward scaled by 1.01 (the returned loss stays right)."""
    real = RG.ga_scaled
    monkeypatch.setattr(RG, "ga_scaled", lambda trainer, loss, n: real(trainer, loss, n) * 1.01)
    with pytest.raises(AssertionError, match="micro-step 1"):  # the gradients moved the weights of the next step
        _control_run(tmp_path, saved_model)


def test_control_padding_free_off_by_one_column_fails_parity(tmp_path, unpatched, saved_model, monkeypatch):
    real = PF._grid
    monkeypatch.setattr(PF, "_grid", lambda value, first, width: real(value, max(first - 1, 0), width))
    with pytest.raises(AssertionError):
        _control_run(tmp_path, saved_model)


def test_fallbacks_keep_stock_numbers_and_say_why(tmp_path, unpatched, saved_model, caplog, monkeypatch):
    """An entropy mask (a quantile over every row) scores the step at once; under "auto", active dropout keeps TRL's
    forwards (other forwards would draw other masks): same numbers as stock, each reason logged once."""
    from slimrl.models import long_context
    from slimrl.ops import row_groups as rg

    monkeypatch.setattr(rg, "AUTO_GROUP_TOKENS", 12)  # "auto" would group these tiny rows
    monkeypatch.setattr(long_context, "CPU_MIN_FORWARD_TOKENS", 1)  # even on a CPU
    config = dict(top_entropy_quantile=0.5, num_iterations=2, per_device_train_batch_size=4, num_generations=2)
    with caplog.at_level(logging.INFO, logger="slimrl"):
        trainers, _ = _run("grpo", tmp_path, "memory", saved_model, config, True, {ROWS_FIELD: 1})
        stats = RG.row_group_stats(trainers.patched)
        assert stats.grouped_steps == 0 and stats.reasons
        dropout = dict(beta=0.0, disable_dropout=False, num_iterations=2, per_device_train_batch_size=4)
        trainers = R.build_sides("grpo", lambda: T.tiny_model(0, attention_dropout=0.3), dropout, str(tmp_path))
        R.assert_traces_match(R.run_sides("grpo", trainers))
    assert PF.padding_free_stats(trainers.patched).positions_padded == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("top_entropy_quantile" in m for m in messages) == 1
    assert sum(rules.DROPOUT_REASON in m for m in messages) == 1


def test_subclass_with_its_own_loss_is_scored_at_once(tmp_path, unpatched, caplog):
    """A subclass's own `_compute_loss` was not checked for groups: TRL's one forward, the reason said once."""
    from trl import GRPOTrainer

    class OwnLoss(GRPOTrainer):
        def _compute_loss(self, model, inputs):
            return super()._compute_loss(model, inputs) * 2

    with P.patched_state("grpo"), caplog.at_level(logging.INFO, logger="slimrl"):
        args = R.make_config("grpo", str(tmp_path), **{ROWS_FIELD: 1})
        trainer = OwnLoss(
            model=T.tiny_model(0),
            reward_funcs=R.reward_ids,
            args=args,
            train_dataset=R.dataset(),
            processing_class=T.tokenizer(),
            peft_config=T.lora_config(),
        )
        trainer.current_gradient_accumulation_steps = 1
        for _ in range(2):
            trainer.training_step(trainer.model, R.generation_batch(args), None)
    stats = RG.row_group_stats(trainer)
    assert stats.grouped_steps == 0 and sum(stats.reasons.values()) == 2
    assert sum("OwnLoss._compute_loss" in r.getMessage() for r in caplog.records) == 1


def test_second_logprob_call_inside_a_group_is_refused(tmp_path, unpatched):
    with P.patched_state("grpo"):
        args = R.make_config("grpo", str(tmp_path), **{ROWS_FIELD: 1})
        trainer = R.build_trainer("grpo", T.tiny_model(0), args, T.lora_config())
        ids = torch.randint(3, T.VOCAB, (2, 9))
        mask = torch.ones_like(ids)
        state = RG.trainer_state(trainer)
        state.row_selection = RG.RowSelection(2, None)
        state.row_selection.select(torch.tensor([0]))
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 4)
        with pytest.raises(RuntimeError, match=ROWS_FIELD):
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 4)
        state.row_selection = None


def test_config_fields(tmp_path, unpatched):
    with P.patched_state("grpo"):
        args = R.make_config("grpo", str(tmp_path))
        assert (args.slimrl_rows_per_group, args.slimrl_padding_free, args.slimrl_tiled_mlp) == ("auto",) * 3
        for field, bad in ((ROWS_FIELD, 0), (ROWS_FIELD, True), (rules.PADDING_FREE_FIELD, "yes")):
            with pytest.raises(ValueError, match=field):
                R.make_config("grpo", str(tmp_path), **{field: bad})
        with pytest.raises(ValueError, match=TILED_MLP_FIELD):
            R.make_config("grpo", str(tmp_path), **{TILED_MLP_FIELD: -1})
    with P.patched_state("rloo"):
        args = R.make_config("rloo", str(tmp_path), slimrl_rows_per_group=False, slimrl_tiled_mlp=64)
        assert args.slimrl_rows_per_group is False and args.slimrl_tiled_mlp == 64
