"""Helpers for the models tests (a plain module: tests/ has no packages)."""

import torch


def batch(vocab_size=512, rows=2, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab_size, (rows, length), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def lora_grads(model, inputs) -> dict:
    model.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def lora_grads_around_generate(model, inputs) -> tuple[dict, dict]:
    """LoRA grads in training mode, then again after a no-grad greedy `generate` in inference mode."""
    from slimrl import FastLanguageModel

    FastLanguageModel.for_training(model)
    before = lora_grads(model, inputs)
    FastLanguageModel.for_inference(model)
    with torch.no_grad():
        model.generate(input_ids=inputs["input_ids"][:, :4], max_new_tokens=3, do_sample=False)
    FastLanguageModel.for_training(model)
    return before, lora_grads(model, inputs)


def trainer_enables_checkpointing(model, checkpoint_kwargs=None, every_n_layers=1, offload=False):
    """The call `Trainer.train` makes when the config asks for checkpointing, on the installed transformers: 5.23 and
    later `activation_checkpointing_enable` where the model has it, before 5.23 `gradient_checkpointing_enable`."""
    if hasattr(model, "activation_checkpointing_enable"):
        return model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=checkpoint_kwargs, every_n_layers=every_n_layers, offload=offload
        )
    return model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=checkpoint_kwargs, every_n_layers=every_n_layers, offload=offload
    )
