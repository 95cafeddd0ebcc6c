"""Image-text models under the sharing seams: each distinct image of a forward encoded once (slimrl.ops.image_features).

Installed by patches/scoring/shared_prefix.py around TRL's log-prob seams (GRPO/RLOO policy, old-policy and reference
forwards;
DPO's loss and reference passes) and by online.py around each rollout (generation's prefill), for as long as the
seam runs: the module whose forward calls `self.get_image_features` (the `model` inside a `...ForConditionalGeneration`)
gets an instance attribute of that name, `encode_distinct` over the original bound method; the attribute there before
(usually none: the class method) is put back on exit. With `slimrl_shared_prefix=False` nothing is installed.
Where it does not apply, the model encodes one image per row as stock (the reason logged once per trainer):
- a model type whose encoder was not checked to encode each image on its own (VERIFIED_MODEL_TYPES: the parity and
  per-image tests of tests/patches/trainers/test_vision_parity.py and tests/ops/test_image_features.py cover each);
- under "auto", active dropout in the model (copies of one image would share one dropout mask);
- a call not asking for a ModelOutput (`return_dict` not True: the fields' layout is then the caller's business).
"""

from __future__ import annotations

import functools
import inspect

from ...ops.image_features import encode_distinct
from ...swaps import SHARED_IMAGES_LAYER, scoring_layer
from ..setup.shared_prefix_rules import AUTO, has_active_dropout

VERIFIED_MODEL_TYPES = frozenset({"gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"})
METHOD = "get_image_features"


def encoder_owner(base):
    """The module whose forward calls `self.get_image_features` (None: not an image-text model)."""
    if getattr(base.config, "vision_config", None) is None:
        return None
    inner = getattr(base, "model", None)
    for module in (inner, base):
        if module is not None and hasattr(type(module), METHOD):
            return module
    return None


def image_problem(base, setting) -> str | None:
    """Why this model's images are encoded once per row (None: once per distinct image)."""
    model_type = base.config.model_type
    if model_type not in VERIFIED_MODEL_TYPES:
        return f"model type {model_type!r} is not verified for encoding each distinct image once"
    if setting == AUTO and has_active_dropout(base):
        return "dropout is active (copies of one image would share one dropout mask)"
    return None


def _distinct_encoder(owner, original, record):
    takes_grid = "image_grid_thw" in inspect.signature(original).parameters
    merge_size = getattr(getattr(owner, "visual", None), "spatial_merge_size", 1)

    @functools.wraps(original)
    def get_image_features(pixel_values, *args, **kwargs):
        grid = (args[0] if args else kwargs.get("image_grid_thw")) if takes_grid else None
        extra = args[1:] if takes_grid else args
        if kwargs.get("return_dict") is not True or pixel_values is None or extra or (takes_grid and grid is None):
            return original(pixel_values, *args, **kwargs)
        kwargs.pop("image_grid_thw", None)
        output, given, encoded = encode_distinct(original, pixel_values, grid, merge_size=merge_size, **kwargs)
        record(given, encoded)
        return output

    return get_image_features


def distinct_images(bases, setting, record, note):
    """While active, each image-text model among `bases` encodes each distinct image of a forward once.

    record(images_given, images_encoded) is called per encoder call; note(reason) when a model keeps stock's path."""
    served = {}  # id(encoder owner) -> (the owner, the first of `bases` it serves)
    for base in bases:
        owner = encoder_owner(base)
        if owner is not None:
            served.setdefault(id(owner), (owner, base))

    def make(owner, original):
        reason = image_problem(served[id(owner)][1], setting)
        if reason is not None:
            note(reason)
            return None
        return _distinct_encoder(owner, original, record)

    return scoring_layer([owner for owner, _ in served.values()], METHOD, SHARED_IMAGES_LAYER, make, own=False)
