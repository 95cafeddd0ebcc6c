"""Each distinct image of a forward encoded once: the shared-prefix idea applied to pixels.

GRPO's rows repeat every prompt `num_generations` times and DPO's repeat it for chosen and rejected, and TRL hands the
model one copy of the prompt's pixels per row: stock, the vision tower encodes the same image once per row.
`encode_distinct` stands in for an image-text model's `get_image_features(pixel_values, [image_grid_thw,] ...)`:
1. split the call's pixels into images: `image_grid_thw` given ("grid" layout, the Qwen-VL families), image i owns
   `prod(image_grid_thw[i])` consecutive patch rows; otherwise ("batch" layout, e.g. Gemma 3) image i is
   `pixel_values[i]`;
2. group bit-identical images (`torch.equal` on the pixels, and equal grids): no hashing, no tolerance;
3. encode one image per group with the model's own `get_image_features`;
4. give every image its group's features: per-image tensors indexed, concatenated ones split and re-joined in the
   call's order, so the result has the layout and values the model's forward reads (`pooler_output`, Qwen3-VL's
   `deepstack_features`, `last_hidden_state`).
Why this stays exact: the encoders it is used on (slimrl.patches.scoring.shared_images.VERIFIED_MODEL_TYPES) encode each
image on its own (Qwen-VL attention is block-diagonal over images, `cu_seqlens`; SigLIP attends within one batch
element), so an image's features do not depend on which other images share the call; equal pixels give equal
features. The backward of the indexing sums the copies' gradients into the one encoding, which is the gradient of
the per-row computation. Only the float rounding of a smaller batched product may differ (tests/patches/_parity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageGroups:
    """Which images of a call are the same: `first[g]` is group g's first image, `inverse[i]` image i's group."""

    first: list[int]
    inverse: list[int]
    patches: list[int] | None  # grid layout: patch rows of each image (None: batch layout)

    @property
    def repeated(self) -> bool:
        return len(self.first) < len(self.inverse)


def _grid_images(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    patches = image_grid_thw.prod(-1).tolist()
    return list(torch.split(pixel_values, patches)), patches


def image_groups(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None = None) -> ImageGroups:
    """Group the call's images by exact equality (pixels and grid)."""
    if image_grid_thw is not None:
        images, patches = _grid_images(pixel_values, image_grid_thw)
        grids = [tuple(row) for row in image_grid_thw.tolist()]
    else:
        images, patches, grids = list(pixel_values), None, [None] * pixel_values.shape[0]
    first, inverse = [], []
    for i, image in enumerate(images):
        for group, j in enumerate(first):
            if grids[j] == grids[i] and images[j].shape == image.shape and torch.equal(images[j], image):
                inverse.append(group)
                break
        else:
            inverse.append(len(first))
            first.append(i)
    return ImageGroups(first, inverse, patches)


def distinct_inputs(pixel_values, image_grid_thw, groups: ImageGroups):
    """(pixel_values, image_grid_thw) of one image per group."""
    if groups.patches is None:
        return pixel_values[groups.first], None
    images, _ = _grid_images(pixel_values, image_grid_thw)
    return torch.cat([images[i] for i in groups.first]), image_grid_thw[groups.first]


class _Expander:
    """Maps each field of the distinct images' output to the call's images (module docstring, point 4)."""

    def __init__(self, groups: ImageGroups, merge_size: int):
        self.inverse = groups.inverse
        self.count = len(groups.first)
        if groups.patches is not None:
            self.patches = [groups.patches[i] for i in groups.first]
            self.tokens = [p // merge_size**2 for p in self.patches]
        else:
            self.patches = self.tokens = None

    def _rejoin(self, value: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        parts = torch.split(value, sizes)
        return torch.cat([parts[g] for g in self.inverse])

    def __call__(self, value):
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, (tuple, list)):
            if self.tokens is not None and self._per_image(value):
                return tuple(value[g] for g in self.inverse)
            return type(value)(self(v) for v in value)
        raise TypeError(f"unexpected image-feature field of type {type(value).__name__}")

    def _per_image(self, value) -> bool:
        return len(value) == self.count and all(
            isinstance(v, torch.Tensor) and v.shape[0] == n for v, n in zip(value, self.tokens)
        )

    def _tensor(self, value: torch.Tensor) -> torch.Tensor:
        if self.patches is None and value.shape[0] == self.count:
            return value[self.inverse]
        if self.patches is not None and value.shape[0] == sum(self.patches):
            return self._rejoin(value, self.patches)
        if self.tokens is not None and value.shape[0] == sum(self.tokens):
            return self._rejoin(value, self.tokens)
        raise ValueError(f"an image-feature tensor of shape {tuple(value.shape)} matches no image layout")


def expand_features(output, groups: ImageGroups, merge_size: int = 1):
    """The encoder output of the distinct images, laid out for every image of the call (a new ModelOutput)."""
    expander = _Expander(groups, merge_size)
    return type(output)(**{name: expander(value) for name, value in output.items()})


def encode_distinct(get_image_features, pixel_values, image_grid_thw=None, merge_size: int = 1, **kwargs):
    """`get_image_features(pixel_values, [image_grid_thw,] **kwargs)` computed once per distinct image; returns
    (output, images in the call, images encoded)."""
    groups = image_groups(pixel_values, image_grid_thw)
    grid_args = () if image_grid_thw is None else (image_grid_thw,)
    if not groups.repeated:
        return get_image_features(pixel_values, *grid_args, **kwargs), len(groups.inverse), len(groups.first)
    pixels, grid = distinct_inputs(pixel_values, image_grid_thw, groups)
    output = get_image_features(pixels, *(() if grid is None else (grid,)), **kwargs)
    return expand_features(output, groups, merge_size), len(groups.inverse), len(groups.first)
