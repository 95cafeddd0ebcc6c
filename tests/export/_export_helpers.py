"""Helpers the export tests share (imported by name; fixtures live in conftest.py)."""

import torch

PROMPTS = [
    "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nCompute 12 times 5 minus 5.<|im_end|>\n<|im_start|>assistant\n",
]


def encode(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


@torch.no_grad()
def logits(model, tokenizer, text: str = PROMPTS[0]) -> torch.Tensor:
    return model(encode(tokenizer, text)).logits[0].float()


@torch.no_grad()
def greedy(model, tokenizer, text: str, max_new_tokens: int = 10) -> list[int]:
    ids = encode(tokenizer, text)
    out = model.generate(
        ids,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    return out[0, ids.shape[1] :].tolist()


def assert_same_logits(reference: torch.Tensor, candidate: torch.Tensor, atol: float) -> None:
    """The comparison every round trip uses; its negative controls show a 0.1% weight error fails it."""
    difference = (reference - candidate).abs().max().item()
    assert difference <= atol, f"logits differ by {difference:.3g} > {atol:.3g}"
