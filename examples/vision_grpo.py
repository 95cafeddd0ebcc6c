"""Vision GRPO on CPU in about a minute: a tiny image-text model is rewarded for naming the colour of the squares it
is shown.

Everything is local: the images are drawn here with PIL (6-12 filled squares of red, green or blue on white), the
model is a tiny random-weight Qwen2-VL (slimrl.testing_vision) loaded with FastVisionModel and trained in full
(PatchFastRL("grpo", FastVisionModel): the lean head, each distinct prompt image encoded once), and the reward gives
1 for the right answer letter (r, g or b) and 0.2 for another colour letter. The held-out evaluation (greedy answers
on images not trained on) is printed before and after.

What moves, measured with the defaults (40 steps, lr 5e-3, 2 CPU cores): the share of greedy answers that are a
colour letter goes from 0.00 to 1.00; the accuracy stays at chance (0.00 -> 0.23, chance 0.33). A random-weight model
this small does not learn to read the colour in a few CPU steps (nor in 160 supervised steps on the true letters at
lr 1e-2 before GRPO: --warmup-steps 160 --warmup-lr 1e-2 gives a held-out accuracy of 0.29-0.46 along the way).

    python examples/vision_grpo.py               # ~1 min on 2 cores
    python examples/vision_grpo.py --steps 2     # a smoke run
"""

from __future__ import annotations

import argparse
import random
import tempfile

import torch

from slimrl import FastVisionModel, PatchFastRL
from slimrl.testing_vision import COLOURS, draw_shapes, save_tiny_vlm

LETTERS = {colour: colour[0] for colour in COLOURS}  # red -> r, green -> g, blue -> b
QUESTION = "what is this ? answer r , g or b"


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        colour = rng.choice(sorted(COLOURS))
        image = draw_shapes(rng.randint(6, 12), colour, size=32, seed=seed * 1000 + i)
        prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        rows.append({"prompt": prompt, "image": image, "answer": LETTERS[colour]})
    return rows


def first_word(text: str) -> str:
    return (text.split() or [""])[0]


def colour_reward(completions, answer, **kwargs) -> list[float]:
    """1 for the right letter first, 0.2 for another colour letter (the answer format), else 0."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [
        1.0 if first_word(t) == want else 0.2 if first_word(t) in LETTERS.values() else 0.0
        for t, want in zip(texts, answer)
    ]


def _inputs(processor, rows, answers=None):
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    if answers is not None:
        texts = [t + a + "<|im_end|>" for t, a in zip(texts, answers)]
    return processor(text=texts, images=[[r["image"]] for r in rows], return_tensors="pt", padding=True)


def evaluate(model, processor, rows) -> tuple[float, float]:
    """(accuracy, fraction of answers that are a colour letter) of greedy answers."""
    FastVisionModel.for_inference(model)
    with torch.no_grad():
        inputs = _inputs(processor, rows)
        out = model.generate(**inputs, max_new_tokens=2, do_sample=False)
    texts = processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    FastVisionModel.for_training(model)
    words = [first_word(text) for text in texts]
    accuracy = sum(word == r["answer"] for word, r in zip(words, rows)) / len(rows)
    return accuracy, sum(word in ("r", "g", "b") for word in words) / len(rows)


def warmup(model, processor, rows, steps: int, lr: float, seed: int = 0) -> None:
    """Supervised steps on the true answer letter (and the end token) before GRPO."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    processor.tokenizer.padding_side = "left"
    for _ in range(steps):
        batch = rng.sample(rows, 8)
        inputs = _inputs(processor, batch, [row["answer"] for row in batch])
        labels = torch.full_like(inputs["input_ids"], -100)
        labels[:, -2:] = inputs["input_ids"][:, -2:]  # the letter and <|im_end|>
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps")
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--warmup-lr", type=float, default=1e-2)
    parser.add_argument("--kind", default="qwen2_vl", help="a family of slimrl.testing_vision.KINDS")
    parser.add_argument("--lr", type=float, default=5e-3, help="GRPO learning rate (AdamW, full fine-tuning)")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    PatchFastRL("grpo", FastVisionModel)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, processor = FastVisionModel.from_pretrained(save_tiny_vlm(kind=args.kind), dtype=torch.float32)
    train, held_out = make_rows(96, seed=1), make_rows(48, seed=2)
    warmup(model, processor, train, args.warmup_steps, args.warmup_lr)
    before = evaluate(model, processor, held_out)
    config = GRPOConfig(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="slimrl-vision-grpo-"),
        learning_rate=args.lr,
        per_device_train_batch_size=16,
        num_generations=8,
        gradient_accumulation_steps=1,
        max_completion_length=3,
        max_steps=args.steps,
        temperature=1.0,
        beta=0.0,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=colour_reward,
        args=config,
        train_dataset=Dataset.from_list(train),
        processing_class=processor,
    )
    trainer.train()
    after = evaluate(model, processor, held_out)
    for name, (acc, letters) in (("before", before), ("after", after)):
        print(f"held-out, {name} GRPO: accuracy {acc:.2f} (chance 0.33), colour-letter answers {letters:.2f}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
