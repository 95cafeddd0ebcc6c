"""SFT parity: PatchFastRL("sft") computes what stock TRL computes (loss, gradients, logged metrics) over 2 SGD steps.

Cases: plain language modelling ("text" column: every token trained), prompt-completion with
completion_only_loss=True (prompt tokens labelled -100: slimrl's head scores only the completion), the DFT loss;
LoRA and full fine-tuning; batch 3 x 1 and 2 x 2 accumulation (the loss is normalised by Trainer's
num_items_in_batch across the accumulated micro-batches); slimrl_num_chunks -1 / 2 / 3.
"""

import pytest

from slimrl.ops.lean_logprob import LeanLogProbFunction
from slimrl.state import model_state

import _harness as HS
import _pref_parity as H
import _tiny as T

ALGO = "sft"
BS3 = dict(per_device_train_batch_size=3)
BS2_GA2 = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2)

CASES = {
    "text-lora": ("text", dict(**BS3), True, None),
    "text-full-ga2-chunks3": ("text", dict(**BS2_GA2), False, 3),
    "completion_only-lora-ga2": ("prompt_completion", dict(completion_only_loss=True, **BS2_GA2), True, 2),
    "completion_only-dft-full": (
        "prompt_completion",
        dict(completion_only_loss=True, loss_type="dft", **BS3),
        False,
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sft_matches_stock(case, tmp_path, unpatched):
    kind, config, lora, chunks = CASES[case]
    trainers = HS.tiny_sides(H.build_sides, ALGO, config, tmp_path, lora, chunks, data_kind=kind)
    assert H.head_file(trainers.stock).endswith(H.STOCK_HEAD) and H.head_file(trainers.patched).endswith(H.SLIMRL_HEAD)
    traces = H.run_sides(ALGO, trainers)
    H.assert_traces_match(traces)
    s = traces.stock
    if chunks is not None:
        assert LeanLogProbFunction.last_forward_chunks == chunks and LeanLogProbFunction.last_backward_chunks == chunks
    # what the case claims about the labels: completion-only masks real prompt tokens, plain LM only padding
    for batch in s.inputs:
        masked_real = ((batch["labels"] == -100) & (batch["attention_mask"] == 1)).any(1)
        assert masked_real.all() if kind == "prompt_completion" else not masked_real.any()
    assert len({n for x in s.inputs for n in x["attention_mask"].sum(1).tolist()}) >= 3


def test_offload_checkpointing_full_ft_matches_stock(tmp_path, unpatched):
    """Full fine-tuning with FastLanguageModel's "offload" mode on the patched side vs stock's own checkpointing."""
    from slimrl.models.checkpointing import apply_checkpointing, is_checkpointing_active

    config = dict(gradient_checkpointing=True, **BS3)
    trainers = H.build_sides(
        ALGO,
        lambda: T.tiny_model(0),
        config,
        str(tmp_path),
        num_chunks=2,
        patched_model_setup=lambda m: apply_checkpointing(m, "offload"),
    )
    stock, patched = trainers.stock, trainers.patched
    H.assert_traces_match(H.run_sides(ALGO, trainers))
    assert model_state(patched.model).offload_stats.tensors_seen > 0
    assert is_checkpointing_active(stock.model) and is_checkpointing_active(patched.model)
