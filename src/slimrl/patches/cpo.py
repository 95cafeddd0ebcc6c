"""CPO (loss types sigmoid, hinge, ipo, simpo; AlphaPO `alpha`; `cpo_alpha` NLL): TRL 1.16's experimental
CPOTrainer (`trl.experimental.cpo`), patched like ORPO (see orpo.py) to never hold `[2B, T, V]` logits.

`CPOTrainer.concatenated_forward` returns stock's tuple with the same values and dtypes; what differs from ORPO is
read from the trainer exactly as stock reads it:
- log-probs are averaged over the labelled tokens for `loss_type` ipo / simpo, summed otherwise;
- the chosen NLL covers the completion labels only, and is stock's constant `tensor(0.0)` when `cpo_alpha == 0`
  (then no NLL target is scored at all);
- the logits slots are 0-dim tensors equal to stock's `logits.mean()` over B x T x V (CPO keeps every position);
  `get_batch_loss_metrics` and `cpo_loss` run unchanged (AlphaPO, label smoothing, simpo_gamma are theirs).
Encoder-decoder models and non-`nn.Linear` heads fall back to stock with a warning. The set-up patches shared with
DPO/KTO (slimrl_num_chunks, precision, checkpointing, peak_memory_gb) are registered as for ORPO. `trl.CPOConfig` /
`trl.CPOTrainer` are added as reversible aliases of `trl.experimental.cpo`'s classes.
"""

from __future__ import annotations

import functools

import torch

from ..ops.chunked_preference import lean_policy_forward
from .orpo import FORWARD_PARAMS, TRAINER_PARAMS, alias_patches, check_label_shape, lean_head
from .preference_common import preference_trainer_patches
from .registry import Patch, register

CPO_TRAINER = "trl.experimental.cpo.cpo_trainer.CPOTrainer"


def make_concatenated_forward(original):
    @functools.wraps(original)
    def concatenated_forward(self, model, batch):
        lm_head, causal_lm = lean_head(self, model, "CPOTrainer")
        if lm_head is None:
            return original(self, model, batch)
        concatenated_batch = self.concatenated_inputs(
            batch, is_encoder_decoder=False, padding_value=self.pad_token_id, device=self.accelerator.device)
        len_chosen = batch["chosen_labels"].shape[0]
        input_ids = concatenated_batch["concatenated_input_ids"]
        attention_mask = concatenated_batch["concatenated_attention_mask"]
        labels = concatenated_batch["concatenated_labels"]
        check_label_shape(labels, input_ids)
        model_kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
        outputs, stats = lean_policy_forward(
            model, lm_head, causal_lm, input_ids, attention_mask, model_kwargs, labels=labels,
            num_chosen=len_chosen, average_log_prob=self.loss_type in ["ipo", "simpo"],
            nll_labels=None if self.cpo_alpha == 0 else labels, logits_drop_last=False)
        dtype = outputs.logits.dtype  # stock's logits dtype: its log-probs and NLL come out in it
        if self.cpo_alpha == 0:
            nll_loss = torch.tensor(0.0).to(self.accelerator.device)
        else:
            nll_loss = stats.chosen_nll.to(dtype)
        logps = stats.logps.to(dtype)
        result = (logps[:len_chosen], logps[len_chosen:], stats.chosen_mean_logits.to(dtype),
                  stats.rejected_mean_logits.to(dtype), nll_loss)
        if self.aux_loss_enabled:
            return (*result, outputs.aux_loss)
        return result

    return concatenated_forward


register(Patch("cpo", CPO_TRAINER, "concatenated_forward", FORWARD_PARAMS, make_concatenated_forward,
               doc="chunked log-probs / NLL / mean-logits from the hidden states; no [2B, T, V] logits"))
# Set-up shared with DPO/KTO (config knob slimrl_num_chunks, precision, checkpointing, peak_memory_gb metric)
for _patch in preference_trainer_patches("cpo", CPO_TRAINER, "trl.experimental.cpo.cpo_config.CPOConfig",
                                         TRAINER_PARAMS):
    register(_patch)
for _patch in alias_patches("cpo", "trl.experimental.cpo", ("CPOConfig", "CPOTrainer")):
    register(_patch)
