"""Shared-prefix training forwards: each distinct prompt among a forward's rows computed once (GRPO, RLOO, DPO, ORPO,
CPO).

The packing is slimrl.ops.shared_prefix; where and when it applies, shared_prefix_rules.py. Choices, and why:
1. Where: TRL's log-prob seams (GRPO/RLOO `_get_per_token_logps_and_entropies`, through which the policy, old-policy
   and reference forwards all pass; DPO `_compute_loss` and `compute_ref_log_probs`) run unchanged, inside a context
   that wraps the fused log-prob forward of the trainer's models (policy and reference, on the instance, restored on
   exit). TRL's own code still builds the rows, labels, row chunks (`batch_size`), adapter switching and slicing; a
   `model(..., labels=..., fused_lm_head=True)` call it makes gets the packed forward's outputs in its own layout.
   The Patch entries are declared here (`logprob_seam_patches`, `DPO_PATCHES`), listed by online.py and dpo.py.
   ORPO/CPO have no TRL seam of this kind: slimrl's own lean `concatenated_forward` (concatenated_forward.py) asks
   `paired_layout` for the packing of its one model call (the same checks, rule and counters; whole rows, as their
   mean-logits metrics read every position) and feeds the packed rows to the model itself.
2. `slimrl_shared_prefix` False is TRL's forward untouched; True shares wherever it can apply; "auto" (default)
   where the rule of shared_prefix_rules.py expects it to pay.
3. Identical prompts are found among the rows of each forward call, by comparing ids and mask before the first
   label: TRL shuffles the generation batch before splitting it into micro-batches, so a micro-batch holds a
   varying number of completions per prompt; the shuffling (and so the numbers) stay TRL's.
4. Falls back to TRL's forward, logging the reason once per trainer (info under "auto", warning when forced True):
   the model problems of shared_prefix_rules.py, other extra inputs, prompts that are not left-padded, no prompt
   repeated among the rows; under "auto" also a forward too small or a cost estimate above the threshold.
5. Observable: `shared_prefix_stats(trainer)` (kept in the trainer's slimrl.state.TrainerState) counts forwarded
   positions, those TRL's forward would process, and forwards taken each way, so tests show the path was taken.
6. Image-text models: the same contexts (and each rollout, `image_sharing`) encode each distinct image of a forward
   once (shared_images.py); the text rows then take TRL's per-row forward (multimodal inputs are not packed).
   `images_given` / `images_encoded` count what the vision tower was handed and what it encoded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field

from ...state import trainer_state, transformers_model
from ...swaps import SHARED_PREFIX_LAYER, scoring_layer
from ..seams import Patch
from ..setup.shared_prefix_rules import AUTO, CONFIG_FIELD, auto_refusal, model_problem, too_small
from .shared_images import distinct_images

logger = logging.getLogger("slimrl")

PLAIN_KWARGS = frozenset({"input_ids", "attention_mask", "use_cache", "output_router_logits"})
HEAD_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@dataclass
class SharedPrefixStats:
    """What the shared-prefix override did on one trainer."""

    shared_calls: int = 0  # model forwards run packed
    fallback_calls: int = 0  # model forwards left to TRL's per-row path
    positions_forwarded: int = 0  # model positions actually forwarded (packed rows x length, or rows x columns)
    positions_per_row_path: int = 0  # what TRL's per-row path forwards for the same calls
    reasons: Counter = field(default_factory=Counter)  # fallback reason -> calls
    images_given: int = 0  # images handed to an image-text model's vision tower (one per row that shows one)
    images_encoded: int = 0  # images it encoded (one per distinct image where shared_images.py applies)


def shared_prefix_stats(trainer) -> SharedPrefixStats:
    """The trainer's counters (empty until a sharing seam runs)."""
    state = trainer_state(trainer)
    if state.shared_prefix_stats is None:
        state.shared_prefix_stats = SharedPrefixStats()
    return state.shared_prefix_stats


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


def _problem(base, kwargs: dict, labels, setting) -> str | None:
    """Why this call cannot be packed, before any packing (None: go on)."""
    from ...ops.shared_prefix import layout_problem

    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if input_ids is None or attention_mask is None or attention_mask.dim() != 2:
        return "the forward got no input_ids or no 2D attention_mask"
    arguments = {**kwargs, "compute_aux_loss": kwargs.get("output_router_logits")}
    reason = model_problem(base, arguments, input_ids.shape[1], setting)
    extra = sorted(k for k, v in kwargs.items() if v is not None and k not in PLAIN_KWARGS)
    if reason is None and extra:
        reason = f"the forward got other inputs ({', '.join(extra)})"
    if reason is None and setting == AUTO:
        reason = too_small(base.config, *input_ids.shape)
    return reason if reason is not None else layout_problem(attention_mask, labels)


def _layout(base, labels, kwargs: dict, setting, whole_rows: bool = False):
    """The packed layout of the call's rows, or a fallback reason string."""
    from ...ops import shared_prefix as op

    reason = _problem(base, kwargs, labels, setting)
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if reason is None and whole_rows:
        reason = op.whole_rows_problem(attention_mask, base.config._attn_implementation)
    if reason is not None:
        return reason
    groups = op.prompt_groups(input_ids, attention_mask, labels)
    if max(len(g) for g in groups) == 1:
        return "no prompt is repeated among the rows of a forward"
    if whole_rows and sum(len(g) for g in groups) < input_ids.shape[0]:
        return "a row scores no token (its logits still count in the logged metrics)"
    packed = op.pack(input_ids, attention_mask, labels, groups, whole_rows=whole_rows)
    (rows, seq_len), (packed_rows, packed_len) = input_ids.shape, packed.input_ids.shape
    refusal = auto_refusal(base.config, rows, seq_len, packed_rows, packed_len) if setting == AUTO else None
    return packed if refusal is None else refusal


def _packed_output(trainer, base, inner, labels, num_items_in_batch, kwargs, setting):
    """The fused head's output for the rows, through the packed forward; or a fallback reason string."""
    from trl.trainer.utils import FusedCausalLMOutput

    from ...ops import shared_prefix as op

    packed = _layout(base, labels, kwargs, setting)
    if isinstance(packed, str):
        return packed
    out = inner(**op.model_inputs(packed, base), shift_labels=packed.shift_labels, fused_lm_head=True)
    _count(trainer, True, packed.input_ids.numel(), kwargs["input_ids"].numel())
    grid = {
        name: None if getattr(out, name) is None else op.unpack(getattr(out, name), packed) for name in HEAD_OUTPUTS
    }
    label_mask = labels[:, 1:] != op.IGNORE
    denominator = label_mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(
        loss=-grid["log_probs"].sum() / denominator, label_mask=label_mask, aux_loss=None, **grid
    )


def paired_layout(trainer, base, input_ids, attention_mask, labels, model_kwargs: dict):
    """ORPO / CPO (concatenated_forward.py): the whole-row packed layout of the concatenated chosen and rejected rows,
    counted; or None (sharing off, or a fallback: its reason logged once) for the per-row call."""
    setting = getattr(trainer.args, CONFIG_FIELD, AUTO)
    if setting is False:
        return None
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False, **model_kwargs}
    packed = _layout(base, labels, kwargs, setting, whole_rows=True)
    if isinstance(packed, str):
        record_fallback(trainer, packed, input_ids.numel())
        return None
    _count(trainer, True, packed.input_ids.numel(), input_ids.numel())
    return packed


def record_fallback(trainer, reason: str, positions: int) -> None:
    """A forward left to the per-row path: its reason logged once per trainer, its positions counted."""
    setting = getattr(trainer.args, CONFIG_FIELD, AUTO)
    if setting is not False:
        _note(trainer, reason, setting)
        _count(trainer, False, positions, positions)


def _sharing_forward(trainer, base, inner, setting):
    """The instance forward installed on `base` while a seam runs: packed when it can, `inner` (the head) if not."""

    @functools.wraps(inner)
    def forward(*args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        def plain():
            return inner(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )

        if not fused_lm_head or labels is None or shift_labels is not None or args:
            return plain()
        result = _packed_output(trainer, base, inner, labels, num_items_in_batch, kwargs, setting)
        if isinstance(result, str):
            record_fallback(trainer, result, kwargs["input_ids"].numel() if kwargs.get("input_ids") is not None else 0)
            return plain()
        return result

    return forward


def _trainer_bases(trainer) -> list:
    models = (getattr(trainer, "model", None), getattr(trainer, "ref_model", None))
    return [transformers_model(trainer.accelerator.unwrap_model(m)) for m in models if m is not None]


def _count_images(trainer, given: int, encoded: int) -> None:
    stats = shared_prefix_stats(trainer)
    stats.images_given += given
    stats.images_encoded += encoded


def image_sharing(trainer):
    """Each distinct image of the trainer's models' forwards encoded once, while active (shared_images.py)."""
    setting = getattr(trainer.args, CONFIG_FIELD, AUTO)
    if setting is False:
        return contextlib.nullcontext()
    return distinct_images(
        _trainer_bases(trainer),
        setting,
        functools.partial(_count_images, trainer),
        lambda reason: _note(trainer, f"images: {reason}", setting),
    )


@contextlib.contextmanager
def sharing_forwards(trainer):
    """Wrap the fused forward of the trainer's policy and reference models (instance attribute) for the duration."""
    setting = getattr(trainer.args, CONFIG_FIELD, AUTO)

    def make(base, inner):
        return _sharing_forward(trainer, base, inner, setting)

    with scoring_layer(_trainer_bases(trainer), "forward", SHARED_PREFIX_LAYER, make), image_sharing(trainer):
        yield


def make_sharing_seam(original):
    """Wrap a TRL method that runs log-prob forwards (any signature) in `sharing_forwards`."""

    @functools.wraps(original)
    def seam(self, *args, **kwargs):
        if getattr(self.args, CONFIG_FIELD, AUTO) is False:
            return original(self, *args, **kwargs)
        with sharing_forwards(self):
            return original(self, *args, **kwargs)

    return seam


HEAD_OUTPUT_TYPE = (("trl.trainer.utils", "FusedCausalLMOutput", None),)  # built from the packed forward's outputs
LOGPROB_PARAMS = (
    "self",
    "model",
    "input_ids",
    "attention_mask",
    "logits_to_keep",
    "batch_size",
    "compute_entropy",
    "compute_aux_loss",
)


def logprob_seam_patches(trainer_path: str, outer=None, outer_doc: str = "") -> list[Patch]:
    """GRPOTrainer / RLOOTrainer: the log-prob method the policy, old-policy and reference forwards share; `outer`
    (optional) wraps the sharing seam (row_groups.py: row groups around it)."""

    def make(original):
        seam = make_sharing_seam(original)
        return seam if outer is None else outer(seam)

    return [
        Patch(
            trainer_path,
            "_get_per_token_logps_and_entropies",
            LOGPROB_PARAMS,
            make,
            f"{outer_doc}each distinct prompt forwarded once (shared-prefix packing)",
            requires=HEAD_OUTPUT_TYPE,
        )
    ]


DPO_TRAINER = "trl.trainer.dpo_trainer.DPOTrainer"
DPO_PATCHES = [
    Patch(
        DPO_TRAINER,
        "_compute_loss",
        ("self", "model", "inputs", "return_outputs"),
        make_sharing_seam,
        "the prompt forwarded once for chosen and rejected (shared-prefix packing)",
        requires=HEAD_OUTPUT_TYPE,
    ),
    Patch(
        DPO_TRAINER,
        "compute_ref_log_probs",
        ("self", "model", "inputs"),
        make_sharing_seam,
        "the prompt forwarded once for chosen and rejected (reference pass)",
        requires=HEAD_OUTPUT_TYPE,
    ),
]
