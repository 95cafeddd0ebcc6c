"""Tiny local image-text models for tests, benchmarks and examples: real transformers architectures (Gemma 3,
Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with tiny dimensions, random weights, a word-level tokenizer and the family's own
image processor (the PIL one: no torchvision needed). Nothing here downloads anything.

- Gemma 3's processor is transformers' `Gemma3Processor`; `save_tiny_vlm` writes a folder `AutoProcessor` and
  `AutoModelForImageTextToText` load back (what `FastVisionModel.from_pretrained` does).
- transformers 5 builds `Qwen2VLProcessor` (and its 2.5 / 3 kin) only with its video processor, which needs
  torchvision. Where torchvision is missing, the Qwen families get `image_processor_only(...)`: the family's processor
  class with the video part left out (its image and text handling is the family's own code).
"""

from __future__ import annotations

import os
import tempfile

import torch

from .models.vision import image_processor_only
from .testing import tiny_tokenizer

KINDS = ("gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
HIDDEN, LAYERS, HEADS, KV_HEADS = 32, 2, 4, 2
IMAGE_SIZE = 32  # pixels per side the processors resize every image to
_QWEN_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
_GEMMA_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}


def _chat_template(image_text: str) -> str:
    """ChatML whose content may be a list of parts; an image part renders as `image_text`."""
    return (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '" + image_text + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
        "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )


def _gemma_tokenizer(vocab_size: int):
    from transformers import PreTrainedTokenizerFast

    base = tiny_tokenizer(vocab_size)
    base.add_tokens(list(_GEMMA_TOKENS.values()), special_tokens=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        extra_special_tokens=dict(_GEMMA_TOKENS),
    )
    tokenizer.padding_side = "left"
    return tokenizer


def _qwen_tokenizer(vocab_size: int):
    tokenizer = tiny_tokenizer(vocab_size)
    tokenizer.add_tokens(_QWEN_TOKENS, special_tokens=True)
    return tokenizer


def _qwen_processor(kind: str, tokenizer, image_tokens_side: int = 2):
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    patch = 16 if kind == "qwen3_vl" else 14
    pixels = (2 * patch * image_tokens_side) ** 2  # a side x side grid of merged tokens (default 2 x 2: 4 per image)
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=pixels, max_pixels=pixels, patch_size=patch, merge_size=2, temporal_patch_size=2
    )
    name = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}[kind]
    processor_class = getattr(transformers, name)
    template = _chat_template("<|vision_start|><|image_pad|><|vision_end|>")
    try:
        return processor_class(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)
    except (AttributeError, ImportError, TypeError, ValueError):  # no torchvision: no video processor
        return image_processor_only(processor_class)(image_processor, tokenizer, chat_template=template)


def tiny_processor(kind: str, vocab_size: int = 512, image_tokens_side: int = 2):
    """The processor of a tiny model of `kind` (one of KINDS); the Qwen families resize every image to
    `image_tokens_side` x `image_tokens_side` merged tokens (4 patches each), Gemma 3 to 4 tokens."""
    if kind == "gemma3":
        from transformers import Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        return Gemma3Processor(
            image_processor=image_processor,
            tokenizer=_gemma_tokenizer(vocab_size),
            chat_template=_chat_template(_GEMMA_TOKENS["boi_token"]),
            image_seq_length=4,
        )
    if kind in KINDS:
        return _qwen_processor(kind, _qwen_tokenizer(vocab_size), image_tokens_side)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _text(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        **extra,
    )


def tiny_vlm_config(kind: str, tokenizer):
    """A tiny config of `kind` whose special image tokens are the tokenizer's."""
    import transformers

    ids = tokenizer.convert_tokens_to_ids
    if kind == "gemma3":
        return transformers.Gemma3Config(
            text_config=_text(len(tokenizer), head_dim=HIDDEN // HEADS, sliding_window=64),
            vision_config=dict(
                hidden_size=HIDDEN,
                intermediate_size=2 * HIDDEN,
                num_hidden_layers=LAYERS,
                num_attention_heads=HEADS,
                image_size=IMAGE_SIZE,
                patch_size=8,
            ),
            mm_tokens_per_image=4,
            image_token_index=tokenizer.image_token_id,
            boi_token_index=tokenizer.boi_token_id,
            eoi_token_index=tokenizer.eoi_token_id,
        )
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    vision = dict(depth=LAYERS, hidden_size=HIDDEN, num_heads=HEADS, spatial_merge_size=2, temporal_patch_size=2)
    if kind == "qwen2_vl":
        vision.update(embed_dim=HIDDEN, mlp_ratio=2, patch_size=14)
    elif kind == "qwen2_5_vl":
        vision.update(intermediate_size=2 * HIDDEN, out_hidden_size=HIDDEN, patch_size=14, window_size=56)
        vision.update(fullatt_block_indexes=[1])
    else:
        vision.update(intermediate_size=2 * HIDDEN, out_hidden_size=HIDDEN, patch_size=16)
        vision.update(num_position_embeddings=16, deepstack_visual_indexes=[0])
        rope["mrope_interleaved"] = True
    text = _text(len(tokenizer), rope_parameters=rope)
    if kind == "qwen3_vl":
        text["head_dim"] = HIDDEN // HEADS
    config_class = {"qwen2_vl": "Qwen2VLConfig", "qwen2_5_vl": "Qwen2_5_VLConfig", "qwen3_vl": "Qwen3VLConfig"}[kind]
    return getattr(transformers, config_class)(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def tiny_vlm(kind: str = "gemma3", seed: int = 0, dtype: torch.dtype = torch.float32, vocab_size: int = 512):
    """(model, processor): a random tiny image-text model of `kind`; same seed, same weights."""
    from transformers import AutoModelForImageTextToText

    processor = tiny_processor(kind, vocab_size)
    config = tiny_vlm_config(kind, processor.tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model, processor


def save_tiny_vlm(path: str | os.PathLike | None = None, kind: str = "gemma3", seed: int = 0) -> str:
    """A tiny image-text model and its processor in a folder (`FastVisionModel.from_pretrained(path)` loads it)."""
    path = str(path or tempfile.mkdtemp(prefix=f"slimrl-tiny-{kind}-"))
    model, processor = tiny_vlm(kind, seed)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220)}


def draw_shapes(count: int, colour: str = "red", size: int = 64, seed: int = 0):
    """A white PIL image with `count` filled squares of `colour` at seeded, non-overlapping places."""
    import random

    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    draw, rng, cell = ImageDraw.Draw(image), random.Random(seed), size // 4
    for index in rng.sample(range(16), count):
        x, y = (index % 4) * cell, (index // 4) * cell
        draw.rectangle([x + 2, y + 2, x + cell - 3, y + cell - 3], fill=COLOURS[colour])
    return image
