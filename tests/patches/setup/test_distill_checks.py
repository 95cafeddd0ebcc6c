"""The distillation patches beyond parity: what they refuse (naming the option), where stock's path runs instead,
the base teacher's contract, the memory they never allocate, and their seams (exactly theirs, reversible)."""

import pytest
import torch

import slimrl
from slimrl.patches import registry, seams

import _distill_parity as H
import _harness as HS
import _parity as P
import _tiny as T

ALGORITHMS = ("gkd", "gold", "distillation")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_patches_exactly_their_seams_and_unpatch_restores(unpatched, algorithm):
    owners = {p.seam: seams.resolve(p.owner) for p in registry.ALGORITHMS[algorithm]}
    before = {seam: seams.own_attr(owners[seam], seam.rsplit(".", 1)[1]) for seam in owners}
    assert slimrl.PatchFastRL(algorithm) == [algorithm]
    assert set(registry.applied_seams()) == set(owners)
    created = {p.seam for p in registry.ALGORITHMS[algorithm] if p.creates}  # the config fields' defaults
    for seam, owner in owners.items():
        now = seams.own_attr(owner, seam.rsplit(".", 1)[1])
        if seam in created:
            assert before[seam] is seams.MISSING and now is not seams.MISSING
        else:
            assert now is not before[seam] and seams.unwrap_descriptor(now).__slimrl_seam__ == seam
    registry.unpatch(algorithm)
    assert {seam: seams.own_attr(owners[seam], seam.rsplit(".", 1)[1]) for seam in owners} == before


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_teacher_that_is_the_student_is_refused(tmp_path, unpatched, algorithm):
    model = H.lora_student()
    with P.patched_state(algorithm):
        args = H.make_config(algorithm, str(tmp_path))
        with pytest.raises(ValueError, match=r"teacher_model is the model being trained.*base_as_teacher"):
            H.build_trainer(algorithm, model, model, args)


def test_base_teacher_under_fsdp_is_refused(tmp_path, unpatched):
    model = H.lora_student()
    with P.patched_state("gkd"):
        args = H.make_config("gkd", str(tmp_path))
        args.fsdp = ["full_shard"]  # as an FSDP launch leaves it (building one needs several processes)
        with pytest.raises(ValueError, match=r"base_as_teacher\(model\) with fsdp"):
            H.build_trainer("gkd", model, slimrl.base_as_teacher(model), args)


def test_gold_uld_loss_is_refused_naming_the_option(tmp_path, unpatched):
    with P.patched_state("gold"):
        with pytest.raises(ValueError, match=r"use_uld_loss=True.*unpatch\('gold'\)"):
            H.make_config("gold", str(tmp_path), use_uld_loss=True)
    config = H.make_config("gold", str(tmp_path), use_uld_loss=True)  # stock accepts it
    with P.patched_state("gold"):  # a config made before PatchFastRL: refused when the trainer is built
        with pytest.raises(ValueError, match=r"use_uld_loss=True"):
            H.build_trainer("gold", H.student(), H.wide_teacher(), config)


def test_base_as_teacher_refuses_what_it_cannot_share(unpatched):
    with pytest.raises(TypeError, match="needs a PEFT model"):
        slimrl.base_as_teacher(T.tiny_model(0))
    from peft import get_peft_model

    head_adapted = get_peft_model(T.tiny_model(0), T.lora_config(target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="lm_head carries an adapter"):
        slimrl.base_as_teacher(head_adapted)
    teacher = slimrl.base_as_teacher(H.lora_student())
    assert teacher.resize_token_embeddings(T.VOCAB) is teacher.get_input_embeddings()
    with pytest.raises(ValueError, match=f"from {T.VOCAB} to {T.VOCAB + 8} tokens"):
        teacher.resize_token_embeddings(T.VOCAB + 8)


def test_base_teacher_is_the_base_in_eval_mode_and_leaves_the_student_as_it_was(unpatched):
    student = H.lora_student()
    teacher = slimrl.base_as_teacher(student)
    student.train()
    student.base_model.model.model.layers[0].self_attn.q_proj.lora_dropout["default"].p = 0.5  # would perturb
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    with torch.no_grad(), student.disable_adapter():
        student.eval()
        base_logits = student(input_ids=ids).logits
    student.train()
    with torch.no_grad():
        assert torch.equal(teacher(input_ids=ids).logits, base_logits)
        hidden = teacher.base_model(input_ids=ids).last_hidden_state
        assert torch.equal(teacher.get_output_embeddings()(hidden), base_logits)
        assert not torch.equal(student(input_ids=ids).logits, base_logits), "the adapter is active again"
    assert all(m.training for m in student.modules()), "every module back in train mode"
    assert list(teacher.parameters()) == [], "the student is not a submodule of its teacher"
    teacher.eval()
    assert student.training


class _HeadSubclass(torch.nn.Linear):
    """An output layer that is not exactly `nn.Linear` (as a quantized or wrapped head): slimrl cannot vouch for it."""


def _student_with_unknown_head():
    model = H.student()
    head = _HeadSubclass(T.HIDDEN, T.VOCAB, bias=False)
    head.weight = model.lm_head.weight
    model.lm_head = head
    return model


def test_an_unknown_student_head_runs_stock_with_a_warning(tmp_path, unpatched):
    trainers = H.build_sides("gkd", dict(beta=0.5), str(tmp_path), student_factory=_student_with_unknown_head)
    with pytest.warns(UserWarning, match=r"GKDTrainer.compute_loss runs stock.*not a plain torch.nn.Linear"):
        traces = H.run_sides("gkd", trainers, optimizer_steps=1)
    H.assert_traces_match(traces)


def test_return_outputs_runs_stocks_compute_loss(tmp_path, unpatched):
    """Evaluation that keeps the logits (`prediction_loss_only=False`) gets stock's outputs."""
    with P.patched_state("gkd"):
        trainer = H.build_trainer("gkd", H.student(), H.wide_teacher(), H.make_config("gkd", str(tmp_path)))
        batch = next(iter(trainer.get_train_dataloader()))
        with torch.no_grad():
            loss, outputs = trainer.compute_loss(trainer.model, batch, return_outputs=True)
            lean = trainer.compute_loss(trainer.model, batch)
    assert outputs.logits.shape == (*batch["input_ids"].shape, T.VOCAB)
    torch.testing.assert_close(lean, loss, rtol=1e-5, atol=1e-7)


def test_sft_and_gkd_patched_together_set_up_and_measure_once(tmp_path, unpatched):
    """GKDTrainer is an SFTTrainer: with both patched, the set-up runs once and each step records one peak."""
    from slimrl.patches.setup import trainer_setup

    calls = []
    real = trainer_setup._after_init

    def counting(trainer):
        calls.append(type(trainer).__name__)
        real(trainer)

    trainer_setup._after_init = counting
    try:
        with P.patched_state(None):
            trainer = H.build_trainer("gkd", H.student(), H.wide_teacher(), H.make_config("gkd", str(tmp_path)))
            batch = next(iter(trainer.get_train_dataloader()))
            trainer.training_step(trainer.model, batch)
    finally:
        trainer_setup._after_init = real
    assert calls == ["GKDTrainer"]
    assert len(trainer._metrics["train"]["peak_memory_gb"]) == 1


def _largest_allocation(trainer, batch) -> int:
    """Elements of the largest storage any op allocates during one training_step."""
    return HS.largest_allocation(lambda: trainer.training_step(trainer.model, batch, None))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_patched_step_never_allocates_full_logits(tmp_path, unpatched, algorithm):
    from slimrl.testing import tiny_llama

    vocab = 4096  # B*T*V dwarfs every weight (V*H = 131k elements)

    def model(seed):
        return tiny_llama(seed=seed, vocab_size=vocab, hidden_size=T.HIDDEN, num_layers=T.LAYERS)

    def build(state, **extra):
        with state:
            config = H.make_config(algorithm, str(tmp_path), **extra)
            return H.build_trainer(algorithm, model(0), model(1), config, T.lora_config())

    stock = build(P.stock_state())
    patched = build(P.patched_state(algorithm), slimrl_num_chunks=8)
    if algorithm == "distillation":
        batch = [{"prompt": [{"role": "user", "content": p}]} for p in T.PROMPTS[:4]]
        rows = 4 * stock.args.max_completion_length  # at most: only completion positions are scored
    else:
        batch = next(iter(stock.get_train_dataloader()))
        rows = batch["input_ids"].numel()
    full_logits = rows * vocab
    with P.stock_state():
        torch.manual_seed(0)
        stock_peak = _largest_allocation(stock, batch if algorithm == "distillation" else dict(batch))
    from slimrl.ops.chunked_divergence import ChunkedDivergenceFunction

    with P.patched_state(algorithm):
        torch.manual_seed(0)
        patched_peak = _largest_allocation(patched, batch if algorithm == "distillation" else dict(batch))
    assert ChunkedDivergenceFunction.last_chunks == 8, "slimrl_num_chunks reaches the divergence"
    assert stock_peak >= full_logits / 2, "negative control: stock holds logits of (nearly) every position"
    assert patched_peak <= full_logits / 4, f"patched allocated {patched_peak} elements ({full_logits} = B*T*V)"
