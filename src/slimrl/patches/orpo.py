"""ORPO: TRL 1.16's experimental ORPOTrainer (`trl.experimental.orpo`), patched to never hold `[2B, T, V]` logits.

Seams and choices:
- `ORPOTrainer.concatenated_forward(self, model, batch)`: the model runs as stock calls it, but its lm_head is
  swapped for slimrl.ops.chunked_preference (chunked log-probs from the last hidden states). It returns stock's
  tuple `(chosen_logps, rejected_logps, chosen_logits, rejected_logits, chosen_nll_loss[, aux_loss])` with the same
  values and dtypes, except that the two logits slots hold 0-dim tensors equal to stock's `logits.mean()` (over
  B x (T-1) x V, as ORPO slices `[:, :-1]`). Stock's `get_batch_loss_metrics` only ever uses those slots as
  `.detach().mean()`, and the mean of a 0-dim tensor is itself, so TRL's loss and metric code runs unchanged and
  needs no override (a broadcast view of the right shape would also fit, but its `.mean()` would walk B*T*V
  elements and round differently).
- Encoder-decoder models, and models whose output embedding is not a plain `nn.Linear` (LoRA on lm_head,
  `modules_to_save`, quantized heads), fall back to stock's full-logits forward with a warning naming the reason:
  the patch applies class-wide, so raising would break a trainer that stock TRL runs fine; the numbers stay stock's.
- Set-up shared with DPO/KTO (`preference_common.preference_trainer_patches`): the config field
  `slimrl_num_chunks` (alias `unsloth_num_chunks`; -1 auto, N >= 1 chunks of the scored tokens), precision
  resolution, checkpointing mode, `max_length` check, and the `peak_memory_gb` metric in `_stored_metrics`.
- `trl.ORPOConfig` / `trl.ORPOTrainer`: TRL 1.16 has them only under `trl.experimental.orpo`; Unsloth scripts write
  `from trl import ORPOConfig, ORPOTrainer`. They are added as registered, reversible `creates` symbols (unpatch
  deletes them; a TRL that defines them itself is left alone).
"""

from __future__ import annotations

import functools
import importlib
import warnings

import torch

from ..ops.chunked_preference import lean_head_or_reason, lean_policy_forward
from .preference_common import preference_trainer_patches
from .registry import Patch, register

ORPO_TRAINER = "trl.experimental.orpo.orpo_trainer.ORPOTrainer"
FORWARD_PARAMS = ("self", "model", "batch")
TRAINER_PARAMS = ("self", "model", "args", "data_collator", "train_dataset", "eval_dataset", "processing_class")


def lean_head(trainer, model, name: str):
    """`(lm_head, causal_lm)` when the lean forward applies to this trainer/model, else warn and `(None, None)`."""
    if trainer.is_encoder_decoder:
        reason = "the model is an encoder-decoder"
    else:
        lm_head, found = lean_head_or_reason(model, trainer.accelerator.unwrap_model)
        if lm_head is not None:
            return lm_head, found
        reason = found
    warnings.warn(f"slimrl: {name}.concatenated_forward runs stock TRL's full-logits path because {reason}; "
                  "memory and numbers are stock's.", UserWarning, stacklevel=3)
    return None, None


def check_label_shape(labels: torch.Tensor, input_ids: torch.Tensor) -> None:
    # Stock's get_batch_logps raises this when logits [R, T, V] and labels disagree
    if labels.shape != input_ids.shape:
        raise ValueError("Logits (batch and sequence length dim) and labels must have the same shape.")


def make_concatenated_forward(original):
    @functools.wraps(original)
    def concatenated_forward(self, model, batch):
        lm_head, causal_lm = lean_head(self, model, "ORPOTrainer")
        if lm_head is None:
            return original(self, model, batch)
        concatenated_batch = self.concatenated_inputs(
            batch, is_encoder_decoder=False, padding_value=self.padding_value, device=self.accelerator.device)
        len_chosen = batch["chosen_labels"].shape[0]
        input_ids = concatenated_batch["concatenated_input_ids"]
        attention_mask = concatenated_batch["concatenated_attention_mask"]
        labels = concatenated_batch["concatenated_labels"]
        check_label_shape(labels, input_ids)
        model_kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
        # ORPO's chosen NLL covers prompt and response (every attended token), its log-probs only the labels
        nll_labels = torch.where(attention_mask == 1, input_ids, -100)
        outputs, stats = lean_policy_forward(
            model, lm_head, causal_lm, input_ids, attention_mask, model_kwargs, labels=labels,
            num_chosen=len_chosen, average_log_prob=True, nll_labels=nll_labels, logits_drop_last=True)
        dtype = outputs.logits.dtype  # stock's logits dtype: its log-probs and NLL come out in it
        logps = stats.logps.to(dtype)
        result = (logps[:len_chosen], logps[len_chosen:], stats.chosen_mean_logits.to(dtype),
                  stats.rejected_mean_logits.to(dtype), stats.chosen_nll.to(dtype))
        if self.aux_loss_enabled:
            return (*result, outputs.aux_loss)
        return result

    return concatenated_forward


def alias_patches(algorithm: str, module: str, names: tuple[str, ...]) -> list[Patch]:
    """`trl.<name> = <module>.<name>` for each name, added only where TRL has no such symbol."""

    def maker(name):
        return lambda _missing: getattr(importlib.import_module(module), name)

    return [Patch(algorithm, "trl", name, None, maker(name), doc=f"alias of {module}.{name}", creates=True)
            for name in names]


register(Patch("orpo", ORPO_TRAINER, "concatenated_forward", FORWARD_PARAMS, make_concatenated_forward,
               doc="chunked log-probs / NLL / mean-logits from the hidden states; no [2B, T, V] logits"))
# Set-up shared with DPO/KTO (config knob slimrl_num_chunks, precision, checkpointing, peak_memory_gb metric)
for _patch in preference_trainer_patches("orpo", ORPO_TRAINER, "trl.experimental.orpo.orpo_config.ORPOConfig",
                                         TRAINER_PARAMS):
    register(_patch)
for _patch in alias_patches("orpo", "trl.experimental.orpo", ("ORPOConfig", "ORPOTrainer")):
    register(_patch)
