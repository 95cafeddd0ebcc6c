"""Batched greedy generation and held-out accuracy for `slimrl grpo` (before vs after) and `slimrl generate`.

Choices made: prompts are rendered with the tokenizer's chat template (conversational) or used as is (plain text),
left-padded, decoded greedily (`do_sample=False`, so before/after differ only by the weights), and scored with the
task's accuracy reward called exactly as TRL calls reward functions (conversational completions, every other
dataset column passed as a keyword list).
"""

from __future__ import annotations

import torch


def render_prompts(tokenizer, prompts: list) -> list[str]:
    texts = []
    for prompt in prompts:
        if isinstance(prompt, str):
            texts.append(prompt)
        else:
            texts.append(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
    return texts


@torch.no_grad()
def generate_texts(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
) -> list[str]:
    """Completion texts (special tokens removed) for each prompt, in order."""
    texts = render_prompts(tokenizer, prompts)
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only batches must be left-padded for generation
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outputs: list[str] = []
    try:
        for start in range(0, len(texts), max(1, batch_size)):
            batch = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, pad_token_id=pad_id)
            if do_sample:
                kwargs["temperature"] = temperature
            else:  # silence "generation flags are not valid" warnings from a sampling generation_config
                kwargs.update(temperature=None, top_p=None, top_k=None)
            generated = model.generate(**batch, **kwargs)
            new_tokens = generated[:, batch["input_ids"].shape[1] :]
            outputs.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = padding_side
    return outputs


def evaluate_accuracy(model, tokenizer, dataset, accuracy_reward, max_new_tokens: int, batch_size: int = 32) -> dict:
    """{"accuracy", "n", "examples"} on `dataset` with greedy decoding."""
    prompts = list(dataset["prompt"])
    completions = generate_texts(model, tokenizer, prompts, max_new_tokens, batch_size)
    conversational = not isinstance(prompts[0], str) if prompts else True
    wrapped = [[{"role": "assistant", "content": c}] for c in completions] if conversational else completions
    columns = {k: list(dataset[k]) for k in dataset.column_names if k != "prompt"}
    scores = accuracy_reward(prompts=prompts, completions=wrapped, **columns)
    scores = [float(s) if s is not None else 0.0 for s in scores]
    accuracy = sum(scores) / len(scores) if scores else float("nan")
    examples = [{"completion": c, "score": s} for c, s in list(zip(completions, scores))[:4]]
    return {"accuracy": accuracy, "n": len(scores), "examples": examples}
