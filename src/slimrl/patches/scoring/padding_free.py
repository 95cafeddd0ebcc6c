"""Padding-free scoring: a fused log-prob forward that skips the columns where every row is padding.

TRL pads a generation batch's prompts on the left to the longest prompt and its completions on the right to the
longest completion, and scores every row at that width. slimrl scores a step's rows in groups of similar length
(row_groups.py), so most of a group's padding sits in columns that are padding for all of its rows; this forward
drops them. Choices, and why:
1. Where: an instance forward installed over the fused log-prob head of the trainer's policy and reference models
   for the duration of TRL's log-prob method (row_groups.py installs it, beneath the shared-prefix forward, so a
   forward that shared_prefix.py does not pack still comes here). Any call other than TRL's plain fused call (2D mask,
   labels, no positions, no other inputs) passes through untouched. `slimrl_padding_free` "auto" (default) installs
   it on a model without active dropout (fewer columns would draw other dropout masks than stock), True always.
2. Same numbers: the kept columns keep their original positions (`position_ids` = the column index, as the padded
   forward has it: TRL passes no positions, so a left-padded row's tokens sit at their column), every key a kept
   token attends to is kept, and the dropped columns score nothing; the outputs are laid back into TRL's `[B, T - 1]`
   grid with zeros where nothing was scored, as the padded forward returns them. A row alone in its group then has
   no padding left at all: its mask is all ones, which transformers' SDPA path turns into a plain causal call.
3. Observable: `padding_free_stats(trainer)` counts the positions forwarded and those the padded forward would have.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from ...state import trainer_state, transformers_model
from ...swaps import PADDING_FREE_LAYER, scoring_layer
from ..setup.row_groups_rules import AUTO
from ..setup.shared_prefix_rules import has_active_dropout

PLAIN_KWARGS = frozenset({"input_ids", "attention_mask", "use_cache", "output_router_logits"})
GRID_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")


@dataclass
class PaddingFreeStats:
    """What the padding-free forward did on one trainer."""

    trimmed_calls: int = 0  # forwards that dropped padding columns
    positions_forwarded: int = 0  # rows x columns forwarded by the calls that came here
    positions_padded: int = 0  # rows x columns the padded forward would have forwarded for the same calls


def padding_free_stats(trainer) -> PaddingFreeStats:
    state = trainer_state(trainer)
    if state.padding_free_stats is None:
        state.padding_free_stats = PaddingFreeStats()
    return state.padding_free_stats


def _grid(value: torch.Tensor, first: int, width: int) -> torch.Tensor:
    """A trimmed `[b, n]` prediction grid placed at column `first` of a `[b, width]` one, zeros around it."""
    return torch.nn.functional.pad(value, (first, width - first - value.shape[1]))


def _trimmed(inner, stats: PaddingFreeStats, kwargs: dict, labels, num_items_in_batch):
    """The fused head's output for the rows, forwarded without their all-padding columns; None when none."""
    from ...ops.row_groups import column_bounds

    input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
    rows, width = input_ids.shape
    first, last = column_bounds(attention_mask, labels)
    stats.positions_padded += rows * width
    stats.positions_forwarded += rows * (last - first)
    if first == 0 and last == width:
        return None
    stats.trimmed_calls += 1
    positions = torch.arange(first, last, device=input_ids.device).expand(rows, -1)
    out = inner(
        **{**kwargs, "input_ids": input_ids[:, first:last], "attention_mask": attention_mask[:, first:last]},
        position_ids=positions,
        labels=labels[:, first:last],
        num_items_in_batch=num_items_in_batch,
        fused_lm_head=True,
    )
    for name in GRID_OUTPUTS:
        value = getattr(out, name, None)
        if value is not None:
            setattr(out, name, _grid(value, first, width - 1))
    return out


def _padding_free_forward(trainer, inner):
    stats = padding_free_stats(trainer)

    @functools.wraps(inner)
    def forward(*args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        mask = kwargs.get("attention_mask")
        plain_call = (
            fused_lm_head
            and not args
            and labels is not None
            and shift_labels is None
            and kwargs.get("input_ids") is not None
            and mask is not None
            and mask.dim() == 2
            and all(k in PLAIN_KWARGS or v is None for k, v in kwargs.items())
        )
        out = _trimmed(inner, stats, kwargs, labels, num_items_in_batch) if plain_call else None
        if out is not None:
            return out
        return inner(
            *args,
            fused_lm_head=fused_lm_head,
            labels=labels,
            shift_labels=shift_labels,
            num_items_in_batch=num_items_in_batch,
            **kwargs,
        )

    return forward


def padding_free_forwards(trainer, setting=AUTO):
    """Install the padding-free forward over the fused head of the trainer's policy and reference (instance
    attribute) for the duration: `setting` True, or "auto" on a model without active dropout (row_groups_rules.py)."""
    models = (getattr(trainer, "model", None), getattr(trainer, "ref_model", None)) if setting is not False else ()
    bases = [transformers_model(trainer.accelerator.unwrap_model(model)) for model in models if model is not None]

    def make(base, inner):
        if setting == AUTO and has_active_dropout(base):
            return None
        if "position_ids" not in inspect.signature(type(base).forward).parameters:
            return None  # the kept tokens could not keep their positions
        return _padding_free_forward(trainer, inner)

    return scoring_layer(bases, "forward", PADDING_FREE_LAYER, make)
