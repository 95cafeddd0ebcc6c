"""Stock TRL vs slimrl on the same GRPO run with image prompts: peak memory, seconds per step, images the vision
tower encoded, and the loss of each arm.

    PYTHONPATH=src python bench/vision_memory.py                      # writes bench/results/vision_memory.json
    PYTHONPATH=src python bench/vision_memory.py --quick              # smoke run, tiny sizes

Choices:
* Each arm runs in its own process (this script re-invoked with `--child`), one after the other, threads pinned
  (`--threads`, default 1: the machine is shared).
* Model: a random Qwen2-VL (slimrl.testing_vision's tiny configuration with a wider, deeper vision tower:
  `--vision-width`, `--vision-depth`), images resized to `--image-side` x `--image-side` merged tokens (4 patches
  each), LoRA r=16 on the language model's projections through `peft_config`, fp32 on CPU.
* Data: one drawn image per prompt; GRPO with `--generations` completions per prompt and a batch of one prompt's
  completions, `beta=0.04` (a reference forward every step), `--steps` steps, the same seed in both arms.
* Arms differ only by `PatchFastRL("grpo")`. "peak" = peak RSS of the whole process (bench/_common.py's OverallPeak);
  s/step = mean over the steps after the first; "encoded" = images the vision tower encoded (rows of
  `image_grid_thw` it was called with), counted by a forward hook in both arms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _arms import CPU_TRAINING_ARGS  # noqa: E402
from _common import GiB, OverallPeak, pin_threads, render, run_self, step_timer, write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = dict(image_side=4, vision_width=64, vision_depth=2, generations=4, steps=2)


def build_model(vision_width: int, vision_depth: int, image_side: int):
    import torch
    from transformers import AutoModelForImageTextToText

    from slimrl.testing_vision import tiny_processor, tiny_vlm_config

    processor = tiny_processor("qwen2_vl", image_tokens_side=image_side)
    config = tiny_vlm_config("qwen2_vl", processor.tokenizer)
    config.vision_config.embed_dim, config.vision_config.depth = vision_width, vision_depth
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    return model, processor


def child(arm: str, opts: dict) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig

    if arm == "slimrl":
        from slimrl.patches.registry import PatchFastRL

        PatchFastRL("grpo")
    from trl import GRPOConfig, GRPOTrainer

    from slimrl.testing_vision import draw_shapes

    overall = OverallPeak()
    model, processor = build_model(opts["vision_width"], opts["vision_depth"], opts["image_side"])
    encoded = []

    def count_images(module, args, kwargs, output):
        encoded.append(len(kwargs["grid_thw"] if "grid_thw" in kwargs else args[1]))

    model.model.visual.register_forward_hook(count_images, with_kwargs=True)
    question = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many ?"}]}]
    rows = [{"prompt": question, "image": draw_shapes(1 + i % 3, size=64, seed=i)} for i in range(opts["steps"])]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="slimrl-bench-"),
        per_device_train_batch_size=opts["generations"],
        num_generations=opts["generations"],
        max_completion_length=16,
        max_steps=opts["steps"],
        beta=0.04,
        shuffle_dataset=False,
        **CPU_TRAINING_ARGS,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completion_ids, **kw: [float(len(ids)) for ids in completion_ids],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=processor,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    timer = step_timer()
    trainer.add_callback(timer)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    times = timer.times[1:] or timer.times
    return {
        "arm": arm,
        **opts,
        "peak_gib": overall.stop() / GiB,
        "s_per_step": sum(times) / len(times),
        "images_encoded": sum(encoded),
        "encoder_calls": len(encoded),
        "losses": [float(x) for x in losses],
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", default=None)
    parser.add_argument("--opts", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--image-side", type=int, default=16)
    parser.add_argument("--vision-width", type=int, default=256)
    parser.add_argument("--vision-depth", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "vision_memory.json"))
    args = parser.parse_args()
    if args.child:
        pin_threads(args.threads)
        print(json.dumps(child(args.child, json.loads(args.opts))))
        return
    opts = {k: getattr(args, k) for k in ("image_side", "vision_width", "vision_depth", "generations", "steps")}
    opts.update(QUICK if args.quick else {})
    rows = [run_self(["--child", arm, "--opts", json.dumps(opts)], args.threads) for arm in ("stock", "slimrl")]
    head = ["arm", "peak GiB", "s/step", "images encoded", "losses"]
    lines = [
        [
            r.get("arm", "?"),
            f"{r['peak_gib']:.3f}",
            f"{r['s_per_step']:.2f}",
            str(r["images_encoded"]),
            str(r["losses"]),
        ]
        if "error" not in r
        else ["error", r["error"][-200:], "", "", ""]
        for r in rows
    ]
    print(render(head, lines, markdown=True))
    write_results(args.json, rows)


if __name__ == "__main__":
    main()
