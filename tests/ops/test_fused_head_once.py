"""One fused LM head per model object (slimrl/ops/logprob.py, choice 5): a second install (an SFT run, then a GRPO
run, on one model) keeps one head with the second trainer's settings; a forward passes through one head frame. The
negative control: TRL's own helper installed twice stacks two, which the frame count sees."""

from __future__ import annotations

import copy
import inspect

import torch
import trl.trainer.utils as trl_utils

from slimrl import describe
from slimrl.ops.logprob import add_fused_lm_head, fused_head_installed, installed_head
from slimrl.testing import tiny_llama

V = 256


def _head_frames(model) -> int:
    """`_fused_forward` frames around the backbone in a plain (generation-style) forward."""
    seen = []
    hook = model.model.register_forward_hook(
        lambda *_: seen.append(sum(f.function == "_fused_forward" for f in inspect.stack(0)))
    )
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7]]))
    finally:
        hook.remove()
    return seen[0]


def _fused(model):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        return model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs


def test_installing_twice_keeps_one_head_with_the_second_settings():
    model = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=1)
    once = copy.deepcopy(model)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # SFT's
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))  # then GRPO's
    add_fused_lm_head(once, temperature=0.7, outputs=("log_probs", "entropy"))
    assert _head_frames(model) == 1
    assert installed_head(model).temperature == 0.7 and installed_head(model).outputs == ("log_probs", "entropy")
    torch.testing.assert_close(_fused(model), _fused(once), rtol=0, atol=0)
    assert str(describe(model)).count("fused LM head") == 1


def test_negative_control_trls_helper_twice_stacks_two_heads():
    model = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=1)
    trl_utils.add_fused_lm_head(model)
    trl_utils.add_fused_lm_head(model, temperature=0.7)
    assert _head_frames(model) == 2


def test_a_head_for_one_call_gives_an_installed_head_back_as_it_was():
    model = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=1)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    head = model.__dict__["forward"]
    with fused_head_installed(model, temperature=1.0):
        assert installed_head(model).temperature == 1.0 and _head_frames(model) == 1
    assert model.__dict__["forward"] is head and installed_head(model).temperature == 0.7
    bare = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=1)
    with fused_head_installed(bare):
        assert installed_head(bare) is not None
    assert "forward" not in bare.__dict__ and installed_head(bare) is None


def test_an_sft_run_then_a_grpo_run_on_one_model_keep_one_head(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from slimrl import PatchFastRL
    from slimrl.testing import tiny_tokenizer

    PatchFastRL("sft")
    PatchFastRL("grpo")
    model, tokenizer = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=1), tiny_tokenizer(V)
    common = dict(report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2)
    SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=str(tmp_path / "sft"), **common),
        train_dataset=Dataset.from_dict({"text": ["a b c", "d e f"]}),
        processing_class=tokenizer,
    )
    GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(output_dir=str(tmp_path / "grpo"), num_generations=2, max_completion_length=4, **common),
        train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
        processing_class=tokenizer,
    )
    assert _head_frames(model) == 1 and installed_head(model).outputs == ("log_probs", "entropy")
