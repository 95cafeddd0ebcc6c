"""Where a shared-prefix forward applies, and when "auto" uses it: the config field, the model checks, the cost rule.

The forward itself is patches/scoring/shared_prefix.py (the seams) over slimrl.ops.shared_prefix (the packing). Choices:
1. Config field `slimrl_shared_prefix`: "auto" (default) | True | False, its row in slimrl.fields (the families that
   declare it: GRPO, RLOO, DPO, ORPO, CPO), validated by `validate_shared_prefix` alone; the other trainers refuse
   it as an unknown keyword, as TRL refuses any.
2. Where it cannot apply (`model_problem`, checked per forward): multimodal inputs, a MoE aux loss (it counts every
   prompt token once per row), an attention implementation other than SDPA/eager, a model type not verified against
   the per-row forward (tests/ops/test_shared_prefix_op.py; OPT, for one, gives wrong numbers under packing), rows
   longer than the sliding window; under "auto" also active dropout (a shared prompt would share its dropout mask).
3. When "auto" shares (`auto_refusal`): the per-row forward is at least `AUTO_MIN_FLOPS` (below, the packing's own
   cost, a few ms, is what sharing would save) and the packed forward's estimated work is at most
   `AUTO_MAX_COST_RATIO` of the per-row forward's (`estimated_cost_ratio`: projection and MLP FLOPs per forwarded
   position plus dense attention FLOPs per query/key pair). The measurements behind both numbers are in
   README.md, "Each prompt computed once" (bench/shared_prefix_ops.py --sweep / --small).
"""

from __future__ import annotations

from ... import fields

CONFIG_FIELD = fields.SHARED_PREFIX
AUTO = "auto"
AUTO_MAX_COST_RATIO = 0.7
AUTO_MIN_FLOPS = 1e8
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
# Decoder model types whose forward was checked against the per-row forward (tests/ops/test_shared_prefix_op.py)
VERIFIED_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "ministral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "mixtral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo2",
        "smollm3",
        "granite",
    }
)
MULTIMODAL_ARGS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def validate_shared_prefix(value):
    """The one validator of `slimrl_shared_prefix`: "auto" | True | False."""
    if value is True or value is False or value == AUTO:
        return value
    raise ValueError(f"{CONFIG_FIELD} must be 'auto', True or False, got {value!r}.")


def check_config(args) -> None:
    """The config check of the families that declare the field."""
    validate_shared_prefix(getattr(args, CONFIG_FIELD))


def has_active_dropout(base) -> bool:
    import torch

    if not base.training:
        return False
    if getattr(base.config.get_text_config(), "attention_dropout", 0.0):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training for m in base.modules())


def model_problem(base, arguments: dict, seq_len: int, setting) -> str | None:
    """Why this forward cannot be shared, from the model and the call's arguments (None: it can)."""
    present = [name for name in MULTIMODAL_ARGS if arguments.get(name) is not None]
    if present:
        return f"multimodal inputs ({', '.join(present)})"
    config = base.config
    if arguments.get("compute_aux_loss") or getattr(config.get_text_config(), "output_router_logits", False):
        return "a MoE load-balancing aux loss is requested (it counts each prompt token once per row)"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        return f"attention implementation {implementation!r} (shared prefixes need one of {ATTENTION_IMPLEMENTATIONS})"
    if config.model_type not in VERIFIED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not verified for shared-prefix forwards"
    window = getattr(config, "sliding_window", None)
    if window is not None and seq_len > window:
        return f"rows of {seq_len} tokens exceed the model's sliding window ({window})"
    if setting == AUTO and has_active_dropout(base):
        return "dropout is active (a shared prompt would share one dropout mask across its completions)"
    return None


def _linear_flops_per_position(config) -> float:
    """Forward FLOPs of one position through the projections and MLP of one layer (the attention scores excluded)."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return 2.0 * (hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * intermediate)


def forward_flops(config, rows: int, length: int) -> float:
    """Estimated forward FLOPs of `rows` x `length` positions: projections and MLP, plus dense attention pairs."""
    config = config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    linear, pair = _linear_flops_per_position(config), 4.0 * heads * head_dim  # QK^T and PV
    return config.num_hidden_layers * rows * (length * linear + length**2 * pair)


def estimated_cost_ratio(config, rows: int, seq_len: int, packed_rows: int, packed_len: int) -> float:
    """Packed / per-row forward work."""
    return forward_flops(config, packed_rows, packed_len) / forward_flops(config, rows, seq_len)


def too_small(config, rows: int, seq_len: int) -> str | None:
    """Why "auto" keeps TRL's forward whatever the packing (None: worth packing); checked before any packing."""
    if forward_flops(config, rows, seq_len) < AUTO_MIN_FLOPS:
        return f"the forward is under {AUTO_MIN_FLOPS:.0e} FLOPs: packing would cost about what it saves"
    return None


def auto_refusal(config, rows: int, seq_len: int, packed_rows: int, packed_len: int) -> str | None:
    """Why "auto" keeps TRL's forward for this packing (None: share)."""
    reason = too_small(config, rows, seq_len)
    if reason is None and estimated_cost_ratio(config, rows, seq_len, packed_rows, packed_len) > AUTO_MAX_COST_RATIO:
        reason = f"estimated work ratio above {AUTO_MAX_COST_RATIO} (prompts too short next to the completions)"
    return reason
