"""The README's script, on a tiny local model: it must train unchanged on CPU once PatchFastRL has run."""

import json

import pytest
from datasets import Dataset

from slimrl.ops.chunking import num_chunks_of
from slimrl.testing import save_tiny_model


def _reward_len(completions, **kwargs):
    return [float(len(c if isinstance(c, str) else c[0]["content"])) / 10 for c in completions]


def _reward_digit(completions, **kwargs):
    text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(any(ch.isdigit() for ch in t)) for t in text]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_readme_script_trains_on_cpu(tmp_path, algorithm):
    from slimrl import FastLanguageModel, PatchFastRL

    PatchFastRL(algorithm, FastLanguageModel)
    path = save_tiny_model(tmp_path / "tiny", vocab_size=512)
    model, tokenizer = FastLanguageModel.from_pretrained(path, max_seq_length=128, dtype=None)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, use_gradient_checkpointing="offload")
    import trl

    Config = trl.GRPOConfig if algorithm == "grpo" else trl.RLOOConfig
    Trainer = trl.GRPOTrainer if algorithm == "grpo" else trl.RLOOTrainer
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"what is {i} + {i} ?"}] for i in range(8)]})
    args = Config(  # a bare config: no bf16/use_cpu flags, as a user would write it
        output_dir=str(tmp_path / "out"),
        learning_rate=1e-4,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        unsloth_num_chunks=2,
    )
    trainer = Trainer(
        model=model, args=args, reward_funcs=[_reward_len, _reward_digit], train_dataset=ds, processing_class=tokenizer
    )
    base = trainer.model.get_base_model()
    assert num_chunks_of(base) == 2
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not p.equal(before[n])]
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))[:5]}"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    expected = ["peak_memory_gb", "completions/mean_length", "rewards/_reward_len/mean", "rewards/_reward_digit/std"]
    expected += ["entropy", "clip_ratio/region_mean"] if algorithm == "grpo" else ["kl"]
    for key in expected:
        assert key in logs[0], (key, sorted(logs[0]))
    assert 0 < logs[0]["peak_memory_gb"] < 64
    json.dumps(trainer.state.log_history)  # metrics stay plain numbers
