"""slimrl.ops.image_features: each distinct image encoded once gives the per-image encoder's output, values and
gradients, on every verified image-text family (tiny random models, float64, so the only difference is rounding).

Calls mix repeated and distinct images in a scattered order (as TRL's rows repeat a prompt's image); the Qwen-VL
families lay images out as concatenated patch rows with `image_grid_thw`, Gemma 3 as a batch of images. Negative
controls: one changed pixel makes an image distinct; an encoder that mixes images across a call (a stand-in for an
unverified family) would give other features to a repeated image than the grouped call does.
"""

from __future__ import annotations

import pytest
import torch

from slimrl.ops.image_features import encode_distinct, image_groups
from slimrl.patches.scoring.shared_images import VERIFIED_MODEL_TYPES, encoder_owner
from slimrl.testing_vision import KINDS, draw_shapes, tiny_vlm

ORDER = [0, 1, 0, 2, 1, 0]  # image i of the call shows picture ORDER[i]


def _call_inputs(processor, pictures):
    images = [[pictures[k]] for k in ORDER]
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    inputs = processor(text=[text] * len(ORDER), images=images, return_tensors="pt", padding=True)
    return inputs["pixel_values"].to(torch.float64), inputs.get("image_grid_thw")


def _flat(output) -> list[torch.Tensor]:
    tensors = []
    for value in output.values():
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (tuple, list)):
            tensors.extend(v for v in value if isinstance(v, torch.Tensor))
    return tensors


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "gemma3" else k for k in KINDS])
def test_distinct_encoding_equals_per_image(kind):
    assert kind in VERIFIED_MODEL_TYPES
    model, processor = tiny_vlm(kind, dtype=torch.float64)
    owner = encoder_owner(model)
    pictures = [draw_shapes(n, colour, seed=n) for n, colour in ((1, "red"), (2, "blue"), (3, "green"))]
    pixels, grid = _call_inputs(processor, pictures)
    merge = getattr(getattr(owner, "visual", None), "spatial_merge_size", 1)
    grid_args = () if grid is None else (grid,)

    stock = owner.get_image_features(pixels, *grid_args, return_dict=True)
    shared, given, encoded = encode_distinct(owner.get_image_features, pixels, grid, merge_size=merge, return_dict=True)
    assert (given, encoded) == (len(ORDER), 3)
    assert list(stock.keys()) == list(shared.keys())
    for ours, theirs in zip(_flat(shared), _flat(stock), strict=True):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)

    weights = torch.randn_like(stock.pooler_output[0] if kind != "gemma3" else stock.pooler_output)
    grads = []
    for output in (stock, shared):
        pooled = output.pooler_output if kind == "gemma3" else output.pooler_output[0]
        owner.zero_grad()
        (pooled * weights).sum().backward(inputs=list(owner.parameters()), retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in owner.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-9, atol=1e-12, msg=name)


def test_one_changed_pixel_is_another_image():
    pixels = torch.rand(4, 3, 8, 8)
    pixels[2] = pixels[0]
    assert image_groups(pixels).inverse == [0, 1, 0, 2]
    pixels[2, 0, 0, 0] += 1e-6
    assert image_groups(pixels).inverse == [0, 1, 2, 3]


def test_grid_layout_groups_need_equal_grids():
    grid = torch.tensor([[1, 2, 2], [1, 2, 2], [1, 4, 1]])
    pixels = torch.ones(12, 5)  # equal values everywhere: only the grids tell the third image apart
    groups = image_groups(pixels, grid)
    assert groups.inverse == [0, 0, 1] and groups.patches == [4, 4, 4]


def test_encoder_mixing_images_would_differ():
    """Negative control: sharing is exact only for encoders that encode each image on its own."""

    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def mixing_encoder(pixel_values, return_dict=True):  # every image sees the call's mean
        flat = pixel_values.flatten(1)
        return BaseModelOutputWithPooling(pooler_output=flat + flat.mean(0))

    pixels = torch.rand(3, 2, 2)
    pixels[2] = pixels[0]
    shared, _, encoded = encode_distinct(mixing_encoder, pixels)
    assert encoded == 2
    assert not torch.allclose(shared.pooler_output, mixing_encoder(pixels).pooler_output)
