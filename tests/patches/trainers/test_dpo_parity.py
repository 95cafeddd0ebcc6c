"""DPO parity: PatchFastRL("dpo") computes what stock TRL computes (loss, gradients, logged metrics) over 2 SGD steps.

Cases (one run each, not a full product): loss types sigmoid, ipo, hinge, robust, apo_zero, sppo_hard, the
combination ["sigmoid", "sft"] with loss_weights, WPO weighting (log_sum_sq_probs output), precompute_ref_log_probs
with LoRA and with full fine-tuning; LoRA (adapter-disabled reference) and full fine-tuning (reference reloaded from a
saved folder); batch 3 x 1 and 2 x 2 accumulation; prompts and completions of different lengths; slimrl_num_chunks
-1 / 2 / 3. Plus the Unsloth-style script (the negative controls are in test_parity_controls.py).
"""

import pytest

from slimrl.ops.lean_logprob import LeanLogProbFunction
from slimrl.state import model_state

import _harness as HS
import _parity as P
import _pref_parity as H
import _tiny as T

ALGO = "dpo"
BS3 = dict(per_device_train_batch_size=3)
BS2_GA2 = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2)

CASES = {
    "sigmoid-lora": (dict(loss_type=["sigmoid"], **BS3), True, None),
    "ipo-full-chunks3": (dict(loss_type=["ipo"], **BS3), False, 3),
    "hinge-lora-ga2": (dict(loss_type=["hinge"], **BS2_GA2), True, None),
    "robust-full": (dict(loss_type=["robust"], label_smoothing=0.1, **BS3), False, None),
    "apo_zero-lora": (dict(loss_type=["apo_zero"], beta=0.5, **BS3), True, None),
    "sppo_hard-lora-ga2": (dict(loss_type=["sppo_hard"], **BS2_GA2), True, 2),
    "sigmoid+sft-full": (dict(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5], **BS3), False, None),
    "wpo-lora": (dict(loss_type=["sigmoid"], use_weighting=True, **BS3), True, None),
    "precompute-lora": (dict(precompute_ref_log_probs=True, **BS3), True, 2),
    "precompute-full-ga2": (dict(precompute_ref_log_probs=True, loss_type=["ipo"], **BS2_GA2), False, 3),
}


def _factory(lora, saved_model):
    return (lambda: T.tiny_model(0)) if lora else (lambda: T.load_tiny(saved_model))


@pytest.mark.parametrize("case", list(CASES))
def test_dpo_matches_stock(case, tmp_path, saved_model, unpatched):
    config, lora, chunks = CASES[case]
    LeanLogProbFunction.last_forward_chunks = None
    trainers = HS.tiny_sides(H.build_sides, ALGO, config, tmp_path, lora, chunks, _factory(lora, saved_model))
    stock, patched = trainers.stock, trainers.patched
    precompute = config.get("precompute_ref_log_probs", False)
    if precompute:
        # the reference pass ran inside the patched __init__, through slimrl's head, with the knob already set
        assert LeanLogProbFunction.last_forward_chunks == chunks
        assert stock.ref_model is None and patched.ref_model is None
    assert H.head_file(stock).endswith(H.STOCK_HEAD) and H.head_file(patched).endswith(H.SLIMRL_HEAD)
    if not lora and not precompute:  # full fine-tuning: TRL reloaded a reference, which got slimrl's head too
        assert patched.ref_model.forward.__func__.__code__.co_filename.endswith(H.SLIMRL_HEAD)
    traces = H.run_sides(ALGO, trainers)
    s = traces.stock
    assert len(s.losses) == 2 * config.get("gradient_accumulation_steps", 1)
    H.assert_traces_match(traces)
    if precompute:
        assert "ref_chosen_logps" in s.inputs[0] and "ref_rejected_logps" in traces.patched.inputs[0]
    if chunks is not None:
        assert LeanLogProbFunction.last_forward_chunks == chunks and LeanLogProbFunction.last_backward_chunks == chunks
    # ragged shapes: the batches hold completions (and prompts) of different lengths, with padding
    lengths = {n for x in s.inputs for n in x["completion_mask"].sum(1).tolist()}
    assert len(lengths) >= 3 and (s.inputs[0]["attention_mask"] == 0).any()
    assert all(loss != 0 for loss in s.losses)


def test_offload_checkpointing_matches_stock_checkpointing(tmp_path, unpatched):
    """FastLanguageModel's "offload" mode on the patched side (slimrl's checkpoint, saved layer inputs through the
    offload hook) vs stock TRL's own gradient checkpointing: same numbers, and the hook really saw the inputs."""
    from slimrl.models.checkpointing import apply_checkpointing, is_checkpointing_active

    config = dict(gradient_checkpointing=True, **BS2_GA2)
    trainers = H.build_sides(
        ALGO,
        lambda: T.tiny_model(0),
        config,
        str(tmp_path),
        T.lora_config(),
        patched_model_setup=lambda m: apply_checkpointing(m, "offload"),
    )
    stock, patched = trainers.stock, trainers.patched
    H.assert_traces_match(H.run_sides(ALGO, trainers))
    base = patched.model.get_base_model()
    assert model_state(base).checkpointing == "offload" and model_state(base).offload_stats.tensors_seen > 0
    assert is_checkpointing_active(stock.model) and is_checkpointing_active(patched.model)


def test_num_chunks_changes_chunking_not_numbers(tmp_path, unpatched):
    """slimrl_num_chunks=1 and =4 run a different number of chunks and give the same numbers (and stock's)."""
    trainers = H.build_sides(ALGO, lambda: T.tiny_model(0), BS3, str(tmp_path / "a"), T.lora_config(), num_chunks=1)
    traces = H.run_sides(ALGO, trainers)
    assert LeanLogProbFunction.last_forward_chunks == 1
    with P.patched_state(ALGO):
        four = H.build_trainer(
            ALGO,
            T.tiny_model(0),
            H.make_config(ALGO, str(tmp_path / "b"), slimrl_num_chunks=4, **BS3),
            T.lora_config(),
            H.dataset("preference"),
        )
        p4 = H.run_side(four)
    assert LeanLogProbFunction.last_forward_chunks == 4 and LeanLogProbFunction.last_backward_chunks == 4
    H.assert_traces_match(traces)
    H.assert_traces_match(traces._replace(patched=p4))


def test_unsloth_style_script(tmp_path, saved_model, unpatched):
    """PatchFastRL("dpo", FastLanguageModel), then `from trl import DPOConfig, DPOTrainer`, a bare config (no bf16,
    no max_length) and a FastLanguageModel LoRA model with "offload" checkpointing: trains, logs peak memory."""
    import torch

    import slimrl
    from slimrl import FastLanguageModel
    from slimrl.models.checkpointing import checkpointing_mode

    model, tokenizer = FastLanguageModel.from_pretrained(saved_model, max_seq_length=40, dtype=torch.float32)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing="offload")
    slimrl.PatchFastRL("dpo", FastLanguageModel)
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        unsloth_num_chunks=2,
    )
    assert args.bf16 is False and args.slimrl_num_chunks == 2
    trainer = DPOTrainer(model=model, args=args, train_dataset=H.dataset("preference"), processing_class=tokenizer)
    assert trainer.args.max_length == 40, "TRL's default max_length follows the model's max_seq_length"
    assert trainer.args.gradient_checkpointing and checkpointing_mode(model) == "offload"
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(h["peak_memory_gb"] > 0 for h in logged)
    assert model_state(model.get_base_model()).offload_stats.tensors_seen > 0


def test_train_end_to_end_matches_stock(tmp_path, unpatched):
    """`trainer.train()` for 2 steps (TRL's own loop, SGD optimizer, gradient checkpointing on, logging every step):
    same logged loss and DPO metrics, the same gradients at each optimizer step and the same final adapter."""
    config = dict(
        max_steps=2,
        optim="sgd",
        gradient_checkpointing=True,
        loss_type=["sigmoid", "sft"],
        loss_weights=[1.0, 0.3],
        **BS3,
    )

    def train(side):
        with P.side_state(side, ALGO):
            extra = {"slimrl_num_chunks": 2} if side == "patched" else {}
            trainer = H.build_trainer(
                ALGO,
                P.side_model(side, lambda: T.tiny_model(0)),
                H.make_config(ALGO, str(tmp_path), **config, **extra),
                T.lora_config(),
            )
            trainer.step_gradients = P.record_step_gradients(P.finish_side(side, trainer))
            trainer.train()
        return trainer

    trainers = P.Sides(*(train(side) for side in P.Sides._fields))
    keys = (
        "loss",
        "rewards/chosen",
        "rewards/margins",
        "logps/rejected",
        "logits/chosen",
        "entropy",
        "mean_token_accuracy",
        "num_tokens",
    )
    HS.assert_trained_sides_match(trainers, keys)
