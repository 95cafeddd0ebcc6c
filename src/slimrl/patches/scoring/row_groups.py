"""Row groups: a GRPO/RLOO step's rows scored a group at a time, each group its own graph and its own backward, with
TRL's loss, normalisers and logged metrics unchanged.

Which rows form a group and how large it is: slimrl.ops.row_groups; the config fields and when groups cannot
apply: row_groups_rules.py. How a step runs (`compute_loss` seam), and why:
1. TRL's loss is a sum over rows of per-row terms divided by normalisers that depend only on masks and counts
   (grpo/sapo: per-sequence means over B rows; bnpo: the micro-batch's token count; dr_grpo: B x
   max_completion_length; dapo/cispo/vespo: the generation batch's `num_items_in_batch`; luspo: per-sequence sums
   over B; RLOO: per-sequence ratios over B; the entropy bonus: the micro-batch's token count). So the gradient a
   row receives depends on its own log-probs and entropies only.
2. So each group runs TRL's own `_compute_loss` on the WHOLE micro-batch: the log-prob method forwards only the
   group's rows (with grad) and hands TRL full `[B, C]` tensors in which the other rows are constants: the values of
   the groups already scored (detached), placeholders for the groups still to come (the old-policy log-probs where
   the batch has them, else zeros). The group's backward then gives exactly its rows' share of the gradient, every
   normaliser and mask being TRL's. Nothing of TRL's loss is re-implemented.
3. The groups before the last are back-propagated here (scaled for gradient accumulation as the HF Trainer scales
   the loss it receives, under `accelerator.no_sync` so several processes exchange gradients once); their loss
   values, logged metrics and entropy-controller updates are discarded. The last group's loss is returned to TRL's
   `training_step`: every row's value is then real, so the returned loss and the metrics TRL logs are the whole
   micro-batch's, computed by TRL's code.
4. The no-grad passes through the same method (old-policy and reference log-probs, evaluation) run in groups too, at
   most TRL's `batch_size` rows each.
5. Around every call of the log-prob method: the padding-free forward (padding_free.py) and the tiled-MLP swap of
   the model it runs (slimrl.models.tiled_mlp), per their config fields. Whether "auto" groups rows or drops padding
   for a forward of that size on that device is slimrl.models.long_context's decision (row_groups_rules.choose).
Observable: `row_group_stats(trainer)`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field

import torch

from ...models.tiled_mlp import TILED_MLP_DEFAULT, TILED_MLP_FIELD
from ...ops.row_groups import ROWS_DEFAULT, ROWS_FIELD
from ...state import trainer_state
from ..seams import Patch
from ..setup import row_groups_rules as rules
from .padding_free import padding_free_forwards
from .shared_prefix import logprob_seam_patches

logger = logging.getLogger("slimrl")
CONTROLLER_STATE = ("entropy_coef", "_entropy_window_stats", "_last_world_entropy")  # TRL's adaptive entropy


@dataclass
class RowGroupStats:
    """What the row-group seams did on one trainer."""

    grouped_steps: int = 0  # compute_loss calls scored in several groups
    groups: int = 0  # groups those calls ran
    whole_steps: int = 0  # compute_loss calls scored at once (one group was enough, or a fallback)
    grouped_passes: int = 0  # no-grad log-prob calls run in several groups
    reasons: Counter = field(default_factory=Counter)  # fallback reason -> calls


def row_group_stats(trainer) -> RowGroupStats:
    state = trainer_state(trainer)
    if state.row_group_stats is None:
        state.row_group_stats = RowGroupStats()
    return state.row_group_stats


@dataclass
class RowSelection:
    """The rows of the group being scored and the values of the rows already scored (choice 2)."""

    batch_rows: int
    placeholder: torch.Tensor | None  # per-token values standing in for rows not scored yet
    rows: torch.Tensor | None = None
    used: bool = False
    values: list = field(default_factory=lambda: [None, None])  # detached [B, C] log-probs, entropies

    def select(self, rows: torch.Tensor) -> None:
        self.rows, self.used = rows, False

    def assemble(self, index: int, live: torch.Tensor | None) -> torch.Tensor | None:
        """`[B, C]` with the group's live rows in place; the detached values kept for the next groups."""
        if live is None:
            return None
        known = self.values[index]
        if known is None:
            use_placeholder = index == 0 and self.placeholder is not None
            shape = (self.batch_rows, *live.shape[1:])
            known = self.placeholder.to(live.dtype) if use_placeholder else live.new_zeros(shape)
        self.values[index] = known.index_put((self.rows,), live.detach())
        return known.index_put((self.rows,), live)


def _note(trainer, reason: str, setting) -> None:
    stats = row_group_stats(trainer)
    if reason not in stats.reasons:
        log = logger.info if setting == rules.AUTO else logger.warning
        log("slimrl: the step's rows are scored in one forward (%s).", reason)
    stats.reasons[reason] += 1


@contextlib.contextmanager
def discarded_side_effects(trainer):
    """Metrics appended and the adaptive-entropy controller moved inside the block are undone on exit."""
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    lengths = {key: len(values) for key, values in metrics.items()}
    saved = {name: getattr(trainer, name) for name in CONTROLLER_STATE if hasattr(trainer, name)}
    try:
        yield
    finally:
        for key in list(metrics):
            if key in lengths:
                del metrics[key][lengths[key] :]
            else:
                del metrics[key]
        for name, value in saved.items():
            setattr(trainer, name, value)


def ga_scaled(trainer, loss, num_items_in_batch):
    """The loss as the HF Trainer's `training_step` scales it before its backward."""
    scaled = trainer.loss_is_scaled_for_ga
    if scaled is None:
        accepts = getattr(trainer, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None
        scaled = accepts or getattr(trainer, "compute_loss_func", None) is not None
    return loss if scaled else loss / trainer.current_gradient_accumulation_steps


def step_groups(trainer, model, inputs, owner: str) -> list[torch.Tensor] | None:
    """The micro-batch's row groups, or None to score it at once (one group, or a reason logged)."""
    from ...ops.row_groups import plan_groups

    setting = getattr(trainer.args, ROWS_FIELD, ROWS_DEFAULT)
    rows, width = inputs["completion_ids"].shape[0], inputs["prompt_ids"].shape[1] + inputs["completion_ids"].shape[1]
    if not rules.choose(trainer, "row_groups", setting, rows, width).on:
        return None
    reason = rules.loss_problem(trainer, model, inputs, setting, owner)
    if reason is not None:
        _note(trainer, reason, setting)
        return None
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    rows, tokens = rules.group_size(trainer, model, setting)
    groups = plan_groups(input_ids, attention_mask, inputs["completion_ids"].shape[1], rows=rows, tokens=tokens)
    reason = rules.dropout_problem(trainer, model, setting) if len(groups) > 1 else None
    if reason is not None:
        _note(trainer, reason, setting)
    if len(groups) == 1 or reason is not None:
        row_group_stats(trainer).whole_steps += 1
        return None
    return groups


def make_grouped_compute_loss(original):
    """`compute_loss` that scores the micro-batch a row group at a time (choices 2 and 3)."""
    owner = original.__qualname__.rsplit(".", 1)[0]  # GRPOTrainer / RLOOTrainer

    @functools.wraps(original)
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        groups = None
        if torch.is_grad_enabled() and not return_outputs:
            groups = step_groups(self, model, inputs, owner)
        if groups is None:
            return original(self, model, inputs, return_outputs, num_items_in_batch)
        stats = row_group_stats(self)
        stats.grouped_steps, stats.groups = stats.grouped_steps + 1, stats.groups + len(groups)
        state = trainer_state(self)
        selection = RowSelection(inputs["completion_ids"].shape[0], inputs.get("old_per_token_logps"))
        state.row_selection = selection
        try:
            for rows in groups[:-1]:
                selection.select(rows)
                with self.accelerator.no_sync(model):
                    with discarded_side_effects(self):
                        loss = original(self, model, inputs, return_outputs, num_items_in_batch)
                    self.accelerator.backward(ga_scaled(self, loss, num_items_in_batch))
                del loss
            selection.select(groups[-1])
            return original(self, model, inputs, return_outputs, num_items_in_batch)
        finally:
            state.row_selection = None

    return compute_loss


def _policy_group(trainer, inner, model, input_ids, attention_mask, logits_to_keep, compute_entropy, compute_aux_loss):
    """The policy forward of one group inside `compute_loss`: its rows live, the others constants (choice 2)."""
    selection = trainer_state(trainer).row_selection
    if selection.used or input_ids.shape[0] != selection.batch_rows:
        raise RuntimeError(
            "slimrl: the log-prob method was called twice, or on other rows, while a step's rows were scored in "
            f"groups; set {ROWS_FIELD}=False for a trainer that does this."
        )
    selection.used = True
    rows = selection.rows
    logps, entropies, aux_loss = inner(
        trainer, model, input_ids[rows], attention_mask[rows], logits_to_keep, None, compute_entropy, compute_aux_loss
    )
    return selection.assemble(0, logps), selection.assemble(1, entropies), aux_loss


def _grouped_pass(trainer, inner, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
    """A no-grad call in row groups of at most `batch_size` rows (choice 4); None when one group holds them all."""
    from ...ops.row_groups import plan_groups

    setting = getattr(trainer.args, ROWS_FIELD, ROWS_DEFAULT)
    rows = min(input_ids.shape[0], batch_size or input_ids.shape[0])  # TRL's forwards hold at most batch_size
    if not rules.choose(trainer, "row_groups", setting, rows, input_ids.shape[1]).on:
        return None
    rows, tokens = rules.group_size(trainer, model, setting)
    max_rows = batch_size or input_ids.shape[0]
    groups = plan_groups(input_ids, attention_mask, logits_to_keep, rows=rows, tokens=tokens, max_rows=max_rows)
    if len(groups) == 1:
        return None
    reason = rules.dropout_problem(trainer, model, setting)
    if reason is not None:
        _note(trainer, reason, setting)
        return None
    row_group_stats(trainer).grouped_passes += 1
    outputs = [None, None]
    for group in groups:
        parts = inner(trainer, model, input_ids[group], attention_mask[group], logits_to_keep, None, compute_entropy)
        for i, part in enumerate(parts[:2]):
            if part is not None:
                if outputs[i] is None:
                    outputs[i] = part.new_zeros((input_ids.shape[0], *part.shape[1:]))
                outputs[i][group] = part
    return outputs[0], outputs[1], None


def make_row_seam(inner):
    """TRL's log-prob method (any trainer of the family) with row groups, padding-free forwards and the tiled MLP."""
    from ...models.tiled_mlp import tile_mlp

    @functools.wraps(inner)
    def seam(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **extra,
    ):
        tile_mlp(self.accelerator.unwrap_model(model), getattr(self.args, TILED_MLP_FIELD, TILED_MLP_DEFAULT))
        plain = not compute_aux_loss and all(value is None for value in extra.values())
        padding_free = getattr(self.args, rules.PADDING_FREE_FIELD, rules.AUTO)
        rows = min(input_ids.shape[0], batch_size or input_ids.shape[0])  # TRL's forwards hold at most batch_size
        if not rules.choose(self, "padding_free", padding_free, rows, input_ids.shape[1]).on:
            padding_free = False
        with padding_free_forwards(self, padding_free):
            args = (self, inner, model, input_ids, attention_mask, logits_to_keep)
            if trainer_state(self).row_selection is not None and torch.is_grad_enabled():
                return _policy_group(*args, compute_entropy, compute_aux_loss)
            if plain and not torch.is_grad_enabled():
                result = _grouped_pass(*args, batch_size, compute_entropy)
                if result is not None:
                    return result
            return inner(
                self,
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **extra,
            )

    return seam


def row_group_patches(trainer_path: str) -> list[Patch]:
    """GRPOTrainer / RLOOTrainer: the log-prob method (row groups around the shared-prefix seam) and `compute_loss`."""
    return [
        *logprob_seam_patches(
            trainer_path, outer=make_row_seam, outer_doc="row groups, padding-free forwards, tiled MLP; "
        ),
        Patch(
            trainer_path,
            "compute_loss",
            ("self", "model", "inputs", "return_outputs", "num_items_in_batch"),
            make_grouped_compute_loss,
            "the micro-batch scored a row group at a time (each group its own backward)",
        ),
    ]
