"""slimrl's long-context levers pass through while a model generates (models/modes.py:generating): the tiled MLP runs
the class's forward inside a patched trainer's rollout and inside slimrl's `model.generate`, and keeps its setting in
the scoring and training forwards. Negative control: the same forward outside generation is sharded."""

from __future__ import annotations

import torch

from slimrl.models import modes
from slimrl.models.tiled_mlp import tile_mlp, tiled_mlp_state
from slimrl.testing import tiny_llama, tiny_tokenizer

V = 256


def test_a_forward_while_generating_is_not_tiled():
    model = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=2)
    tile_mlp(model, 1)  # every call of more than one token tiled
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), modes.generating():
        inside = model(input_ids=ids).logits
    state = tiled_mlp_state(model)
    assert state.sharded_calls == 0 and modes.is_generating() is False
    with torch.no_grad():
        outside = model(input_ids=ids).logits
    assert state.sharded_calls == 2  # negative control: 2 layers sharded outside generation
    torch.testing.assert_close(inside, outside)


def test_a_patched_rollout_passes_through_and_scoring_still_tiles(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from slimrl import PatchFastRL

    PatchFastRL("grpo")
    model = tiny_llama(0, vocab_size=V, hidden_size=16, num_layers=2)
    tile_mlp(model, 1)
    state = tiled_mlp_state(model)
    during = []
    generate = model.generate

    def counted_generate(*args, **kwargs):  # the rollout's own calls: sharded ones counted around it
        before = state.sharded_calls + state.tiled_calls
        try:
            return generate(*args, **kwargs)
        finally:
            during.append((modes.is_generating(), state.sharded_calls + state.tiled_calls - before))

    model.generate = counted_generate
    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        slimrl_tiled_mlp=1,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
        processing_class=tiny_tokenizer(V),
    )
    trainer.train()
    assert during and all(flag and calls == 0 for flag, calls in during), during
    assert state.tiled_calls > 0  # the training forward kept its setting
