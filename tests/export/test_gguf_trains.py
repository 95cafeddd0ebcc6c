"""A model loaded from a GGUF file trains under the patched GRPOTrainer without `processing_class`: TRL would reload a
processor by the model's name (a cache folder or a .gguf path it cannot read); slimrl hands it the tokenizer
FastLanguageModel.from_pretrained returned with the model (the embedded model takes the same path; its run is in the
nightly tier, tests/cli/test_embedded_grpo_nightly.py)."""

import torch
from datasets import Dataset

from slimrl import FastLanguageModel, PatchFastRL, unpatch


def reward_len(completions, prompts):
    return [float(len(c) % 3) for c in completions]


def test_gguf_model_trains_grpo_without_processing_class(peft_model, tmp_path):
    model, tokenizer = peft_model
    path = model.save_pretrained_gguf(tmp_path / "gguf", tokenizer, quantization_method="f32")
    loaded, loaded_tokenizer = FastLanguageModel.from_pretrained(str(path), dtype=torch.float32, max_seq_length=128)
    loaded = FastLanguageModel.get_peft_model(loaded, r=4, use_gradient_checkpointing=False)
    PatchFastRL("grpo")
    try:
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            max_steps=1,
            learning_rate=1e-3,
            report_to="none",
            save_strategy="no",
        )
        data = Dataset.from_dict({"prompt": ["What is 1 + 2?", "What is 3 + 4?"] * 2})
        trainer = GRPOTrainer(model=loaded, reward_funcs=[reward_len], args=args, train_dataset=data)
        assert trainer.processing_class is loaded_tokenizer
        trainer.train()
        assert trainer.state.global_step == 1
    finally:
        unpatch()
