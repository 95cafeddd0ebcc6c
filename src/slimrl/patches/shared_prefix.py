"""Shared-prefix training forwards: each distinct prompt among a forward's rows computed once (GRPO, RLOO, DPO).

The packing itself is `slimrl.ops.shared_prefix`. Choices, and why:
1. Where: TRL's log-prob seams (GRPO/RLOO `_get_per_token_logps_and_entropies`, through which the policy, old-policy
   and reference forwards all pass; DPO `_compute_loss` and `compute_ref_log_probs`) run unchanged, inside a context
   that wraps the fused log-prob forward of the trainer's models (policy and reference, on the instance, restored on
   exit). TRL's own code still builds the rows, labels, row chunks (`batch_size`), adapter switching and slicing; a
   `model(..., labels=..., fused_lm_head=True)` call it makes gets the packed forward's outputs in its own layout.
2. Config field `slimrl_shared_prefix`: "auto" (default) | True | False. False is TRL's forward untouched. True
   shares wherever it can apply. "auto" shares where the estimated work (`estimated_cost_ratio`: linear-layer FLOPs
   per forwarded position plus dense attention FLOPs per query/key pair, packed vs per-row) is at most
   `AUTO_MAX_COST_RATIO` and the per-row forward is at least `AUTO_MIN_FLOPS`; the measurements behind both are in
   docs/README-shared-prefix.md.
3. Identical prompts are found among the rows of each forward call, by comparing ids and mask before the first
   label: TRL shuffles the generation batch before splitting it into micro-batches, so a micro-batch holds a
   varying number of completions per prompt; the shuffling (and so the numbers) stay TRL's.
4. Falls back to TRL's forward, logging the reason once per trainer (info under "auto", warning when forced True):
   multimodal or other extra inputs, a MoE aux loss (it counts every prompt token per row), an attention
   implementation other than SDPA/eager, a model type not verified here, a sliding window shorter than the rows,
   prompts that are not left-padded, no prompt repeated among the rows; under "auto" also active dropout (a shared
   prompt would share its dropout mask) and a cost estimate above the threshold.
5. Observable: `shared_prefix_stats(trainer)` counts forwarded positions, those TRL's forward would process, and
   forwards taken each way, so tests show the path was really taken.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger("slimrl")

CONFIG_FIELD = "slimrl_shared_prefix"
AUTO = "auto"
# "auto" shares when the packed forward's estimated work is at most this fraction of the per-row forward's, and the
# per-row forward is not tiny (below ~1e8 FLOPs the packing's own cost, a few ms, is what sharing would save)
AUTO_MAX_COST_RATIO = 0.7
AUTO_MIN_FLOPS = 1e8
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

    shared_calls: int = 0  # model forwards run packed
    fallback_calls: int = 0  # model forwards left to TRL's per-row path
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


def auto_refusal(config, rows: int, seq_len: int, packed_rows: int, packed_len: int) -> str | None:
    """Why "auto" keeps TRL's forward for this packing (None: share)."""
    if forward_flops(config, rows, seq_len) < AUTO_MIN_FLOPS:
        return f"the forward is under {AUTO_MIN_FLOPS:.0e} FLOPs: packing would cost about what it saves"
    if estimated_cost_ratio(config, rows, seq_len, packed_rows, packed_len) > AUTO_MAX_COST_RATIO:
        return f"estimated work ratio above {AUTO_MAX_COST_RATIO} (prompts too short next to the completions)"
    return None


def _note(trainer, reason: str, setting) -> None:
    stats = shared_prefix_stats(trainer)
    if reason not in stats.reasons:
        log = logger.warning if setting is True else logger.info
        log("slimrl: shared-prefix forward not used (%s); TRL's per-row forward runs instead.", reason)
    stats.reasons[reason] += 1


def _count(trainer, shared: bool, positions: int, per_row_positions: int) -> None:
    stats = shared_prefix_stats(trainer)
    if shared:
        stats.shared_calls += 1
    else:
        stats.fallback_calls += 1
    stats.positions_forwarded += positions
    stats.positions_per_row_path += per_row_positions


PLAIN_KWARGS = frozenset({"input_ids", "attention_mask", "use_cache"})


def _problem(base, kwargs: dict, labels, setting) -> str | None:
    arguments = {**kwargs, "compute_aux_loss": kwargs.get("output_router_logits")}
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if input_ids is None or attention_mask is None or attention_mask.dim() != 2:
        return "the forward got no input_ids or no 2D attention_mask"
    reason = model_problem(base, arguments, input_ids.shape[1], setting)
    extra = sorted(k for k, v in kwargs.items() if v is not None and k not in PLAIN_KWARGS | {"output_router_logits"})
    if reason is None and extra:
        reason = f"the forward got other inputs ({', '.join(extra)})"
    if reason is None:
        from ..ops.shared_prefix import layout_problem

        reason = layout_problem(attention_mask, labels)
    return reason


def _packed_output(trainer, base, inner, labels, num_items_in_batch, kwargs, setting):
    """The fused head's output for the rows, through the packed forward; or a fallback reason string."""
    from trl.trainer.utils import FusedCausalLMOutput

    from ..ops import shared_prefix as op

    reason = _problem(base, kwargs, labels, setting)
    if reason is not None:
        return reason
    input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
    groups = op.prompt_groups(input_ids, attention_mask, labels)
    if max(len(g) for g in groups) == 1:
        return "no prompt is repeated among the rows of a forward"
    packed = op.pack(input_ids, attention_mask, labels, groups)
    (rows, seq_len), (packed_rows, packed_len) = input_ids.shape, packed.input_ids.shape
    refusal = auto_refusal(base.config, rows, seq_len, packed_rows, packed_len) if setting == AUTO else None
    if refusal is not None:
        return refusal
    mask = op.attention_mask_4d(packed, base.config._attn_implementation, base.get_input_embeddings().weight.dtype)
    out = inner(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids,
                shift_labels=packed.shift_labels, fused_lm_head=True)
    _count(trainer, True, packed_rows * packed_len, rows * seq_len)
    names = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    grid = {name: None if getattr(out, name) is None else op.unpack(getattr(out, name), packed) for name in names}
    label_mask = labels[:, 1:] != op.IGNORE
    denominator = label_mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-grid["log_probs"].sum() / denominator, label_mask=label_mask, aux_loss=None,
                               **grid)


def _sharing_forward(trainer, base, inner, setting):
    """The instance forward installed on `base` while a seam runs: packed when it can, `inner` (the head) if not."""

    @functools.wraps(inner)
    def forward(*args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        def plain():
            return inner(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                         num_items_in_batch=num_items_in_batch, **kwargs)

        if not fused_lm_head or labels is None or shift_labels is not None or args:
            return plain()
        result = _packed_output(trainer, base, inner, labels, num_items_in_batch, kwargs, setting)
        if isinstance(result, str):
            _note(trainer, result, setting)
            positions = kwargs["input_ids"].numel() if kwargs.get("input_ids") is not None else 0
            _count(trainer, False, positions, positions)
            return plain()
        return result

    forward.__slimrl_shared_prefix__ = True
    return forward


@contextlib.contextmanager
def sharing_forwards(trainer):
    """Wrap the fused forward of the trainer's policy and reference models (instance attribute) for the duration."""
    setting = getattr(trainer.args, CONFIG_FIELD, AUTO)
    installed = []
    for model in (getattr(trainer, "model", None), getattr(trainer, "ref_model", None)):
        if model is None:
            continue
        base = _base_model(trainer, model)
        inner = base.__dict__.get("forward")  # the fused head TRL installed on the instance
        if inner is None or getattr(inner, "__slimrl_shared_prefix__", False):
            continue
        base.forward = _sharing_forward(trainer, base, inner, setting)
        installed.append((base, inner))
    try:
        yield
    finally:
        for base, inner in installed:
            base.forward = inner


def make_sharing_seam(original):
    """Wrap a TRL method that runs log-prob forwards (any signature) in `sharing_forwards`."""

    @functools.wraps(original)
    def seam(self, *args, **kwargs):
        if getattr(self.args, CONFIG_FIELD, AUTO) is False:
            return original(self, *args, **kwargs)
        with sharing_forwards(self):
            return original(self, *args, **kwargs)

    return seam


def shared_prefix_patches(algorithm: str, module: str, trainer: str):
    """The Patch entries for GRPOTrainer / RLOOTrainer."""
    from .registry import Patch

    params = ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
              "compute_aux_loss")
    return [Patch(algorithm, f"{module}.{trainer}", "_get_per_token_logps_and_entropies", params, make_sharing_seam,
                  "each distinct prompt forwarded once (shared-prefix packing)")]


def dpo_shared_prefix_patches():
    """The Patch entries for DPOTrainer: its policy and reference forwards."""
    from .registry import Patch

    owner = "trl.trainer.dpo_trainer.DPOTrainer"
    return [Patch("dpo", owner, "_compute_loss", ("self", "model", "inputs", "return_outputs"), make_sharing_seam,
                  "the prompt forwarded once for chosen and rejected (shared-prefix packing)"),
            Patch("dpo", owner, "compute_ref_log_probs", ("self", "model", "inputs"), make_sharing_seam,
                  "the prompt forwarded once for chosen and rejected (reference pass)")]
