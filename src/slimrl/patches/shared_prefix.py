"""Shared-prefix training forwards for GRPO and RLOO: each distinct prompt of a forward's rows computed once.

The override is on `_get_per_token_logps_and_entropies` (policy, old-policy and reference forwards all pass through
it); the packing itself is `slimrl.ops.shared_prefix`. Choices, and why:
1. Config field `slimrl_shared_prefix`: "auto" (default) | True | False. False is TRL's per-row path untouched.
   True shares wherever it can apply. "auto" shares where the estimated work (`estimated_cost_ratio`: linear-layer
   FLOPs per forwarded position plus dense attention FLOPs per query/key pair, packed vs per-row) is at most
   `AUTO_MAX_COST_RATIO`; the measurement behind the threshold is in docs/README-shared-prefix.md.
2. Identical prompts are found inside each row chunk TRL would forward (`batch_size`), by comparing prompt ids and
   mask: TRL shuffles the generation batch before splitting it into micro-batches, so a micro-batch holds a varying
   number of completions per prompt; the shuffling (and so the numbers) stay TRL's.
3. Falls back to TRL's path, logging the reason once per trainer (info under "auto", warning when forced True):
   multimodal inputs, a MoE aux loss (it counts every prompt token per row), an attention implementation other than
   SDPA/eager, a model type not verified here, a sliding window shorter than the rows, prompts that are not
   left-padded, no prompt repeated among the rows; under "auto" also active dropout (a shared prompt would share its
   dropout mask) and a cost estimate above the threshold.
4. Observable: `shared_prefix_stats(trainer)` counts forwarded positions, those TRL's path would forward, and calls
   taken each way, so tests show the path was really taken.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger("slimrl")

CONFIG_FIELD = "slimrl_shared_prefix"
AUTO = "auto"
# "auto" shares when the packed forward's estimated work is at most this fraction of the per-row forward's
AUTO_MAX_COST_RATIO = 0.7
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
# Decoder model types whose forward was checked against the per-row forward (tests/ops/test_shared_prefix_op.py)
VERIFIED_MODEL_TYPES = frozenset({"llama", "mistral", "ministral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma",
                                  "gemma2", "gemma3_text", "phi3", "olmo2", "smollm3", "granite"})
MULTIMODAL_ARGS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
STATS_ATTR = "_slimrl_shared_prefix_stats"


def validate_shared_prefix(value):
    """The one validator of `slimrl_shared_prefix`: "auto" | True | False."""
    if value is True or value is False or value == AUTO:
        return value
    raise ValueError(f"{CONFIG_FIELD} must be 'auto', True or False, got {value!r}.")


@dataclass
class SharedPrefixStats:
    """What the shared-prefix override did on one trainer."""

    shared_calls: int = 0  # row chunks forwarded packed
    fallback_calls: int = 0  # calls (or row chunks) left to TRL's per-row path
    positions_forwarded: int = 0  # model positions actually forwarded (packed rows x length, or rows x columns)
    positions_per_row_path: int = 0  # what TRL's per-row path forwards for the same calls
    reasons: Counter = field(default_factory=Counter)  # fallback reason -> calls


def shared_prefix_stats(trainer) -> SharedPrefixStats:
    stats = trainer.__dict__.get(STATS_ATTR)
    if stats is None:
        stats = trainer.__dict__[STATS_ATTR] = SharedPrefixStats()
    return stats


def _base_model(trainer, model):
    model = trainer.accelerator.unwrap_model(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _has_active_dropout(base) -> bool:
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
    if arguments.get("compute_aux_loss"):
        return "a MoE load-balancing aux loss is requested (it counts each prompt token once per row)"
    config = base.config
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        return f"attention implementation {implementation!r} (shared prefixes need one of {ATTENTION_IMPLEMENTATIONS})"
    if config.model_type not in VERIFIED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not verified for shared-prefix forwards"
    window = getattr(config, "sliding_window", None)
    if window is not None and seq_len > window:
        return f"rows of {seq_len} tokens exceed the model's sliding window ({window})"
    if setting == AUTO and _has_active_dropout(base):
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


def estimated_cost_ratio(config, rows: int, seq_len: int, packed_rows: int, packed_len: int) -> float:
    """Packed / per-row forward work: positions x linear FLOPs + dense query-key pairs x attention FLOPs."""
    config = config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    linear, pair = _linear_flops_per_position(config), 4.0 * heads * head_dim  # QK^T and PV
    packed = packed_rows * (packed_len * linear + packed_len**2 * pair)
    per_row = rows * (seq_len * linear + seq_len**2 * pair)
    return packed / per_row


def _note(trainer, reason: str, setting) -> None:
    stats = shared_prefix_stats(trainer)
    if reason not in stats.reasons:
        log = logger.warning if setting is True else logger.info
        log("slimrl: shared-prefix forward not used (%s); TRL's per-row forward runs instead.", reason)
    stats.reasons[reason] += 1


def _count_fallback(trainer, input_ids) -> None:
    stats = shared_prefix_stats(trainer)
    stats.fallback_calls += 1
    stats.positions_forwarded += input_ids.numel()
    stats.positions_per_row_path += input_ids.numel()


def _shared_chunk(trainer, model, base, input_ids, attention_mask, logits_to_keep, compute_entropy, setting):
    """(logps, entropies) of one row chunk through the packed forward, or a fallback reason string."""
    from ..ops import shared_prefix as op

    reason = op.layout_problem(attention_mask, logits_to_keep)
    if reason is not None:
        return reason
    groups = op.prompt_groups(input_ids, attention_mask, logits_to_keep)
    if len(groups) == input_ids.shape[0]:
        return "no prompt is repeated among the rows of a forward"
    packed = op.pack(input_ids, attention_mask, logits_to_keep, groups)
    rows, seq_len = input_ids.shape
    packed_rows, packed_len = packed.input_ids.shape
    if setting == AUTO:
        ratio = estimated_cost_ratio(base.config, rows, seq_len, packed_rows, packed_len)
        if ratio > AUTO_MAX_COST_RATIO:
            return f"estimated work ratio above {AUTO_MAX_COST_RATIO} (prompts too short next to the completions)"
    dtype = base.get_input_embeddings().weight.dtype
    mask = op.attention_mask_4d(packed, base.config._attn_implementation, dtype)
    with trainer.accelerator.autocast():
        outputs = model(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                        shift_labels=packed.shift_labels, fused_lm_head=True)
    stats = shared_prefix_stats(trainer)
    stats.shared_calls += 1
    stats.positions_forwarded += packed_rows * packed_len
    stats.positions_per_row_path += rows * seq_len
    entropies = op.unpack(outputs.entropy, packed) if compute_entropy else None
    return op.unpack(outputs.log_probs, packed), entropies


def make_get_per_token_logps(original):
    """Wrap TRL's `_get_per_token_logps_and_entropies` (GRPO and RLOO have the same signature)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        import torch

        setting = getattr(self.args, CONFIG_FIELD, AUTO)
        if setting is False:
            return original(self, *args, **kwargs)
        arguments = signature.bind_partial(self, *args, **kwargs).arguments
        model, input_ids, attention_mask = arguments["model"], arguments["input_ids"], arguments["attention_mask"]
        logits_to_keep, compute_entropy = arguments["logits_to_keep"], arguments.get("compute_entropy", False)
        base = _base_model(self, model)
        reason = model_problem(base, arguments, input_ids.shape[1], setting)
        if reason is not None:
            _note(self, reason, setting)
            _count_fallback(self, input_ids)
            return original(self, *args, **kwargs)
        rows = input_ids.shape[0]
        batch_size = arguments.get("batch_size") or rows
        logps, entropies = [], []
        for start in range(0, rows, batch_size):  # TRL's row chunks: the same memory bound per forward
            ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            result = _shared_chunk(self, model, base, ids, mask, logits_to_keep, compute_entropy, setting)
            if isinstance(result, str):
                _note(self, result, setting)
                _count_fallback(self, ids)
                result = original(self, model, ids, mask, logits_to_keep, compute_entropy=compute_entropy)[:2]
            logps.append(result[0])
            entropies.append(result[1])
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    return _get_per_token_logps_and_entropies


def shared_prefix_patches(algorithm: str, module: str, trainer: str):
    """The Patch entries for one trainer class (GRPOTrainer, RLOOTrainer)."""
    from .registry import Patch

    params = ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
              "compute_aux_loss")
    return [Patch(algorithm, f"{module}.{trainer}", "_get_per_token_logps_and_entropies", params,
                  make_get_per_token_logps, "each distinct prompt forwarded once (shared-prefix packing)")]
