"""CPO (loss types sigmoid, hinge, ipo, simpo; AlphaPO `alpha`; `cpo_alpha` NLL): TRL 1.16's experimental
CPOTrainer (`trl.experimental.cpo`), patched like ORPO to never hold `[2B, T, V]` logits.

Patched: `CPOTrainer.concatenated_forward` (concatenated_forward.py, declared below: log-probs averaged over the
labelled tokens for `loss_type` ipo / simpo, summed otherwise; the chosen NLL over the completion labels only, and
stock's constant `tensor(0.0)` when `cpo_alpha == 0`, when no NLL target is scored at all; the mean-logits metric over
every position; the prompt forwarded once for chosen and rejected under `slimrl_shared_prefix`); the set-up shared
with DPO/KTO (offline.py, `slimrl_shared_prefix` included); `trl.CPOConfig` / `trl.CPOTrainer` as reversible aliases
of `trl.experimental.cpo`'s classes.
`tokenize_row`: with `max_prompt_length` set, TRL 0.2x's prompt-then-answer cut (prompt_limit.py).
TRL's own: `get_batch_loss_metrics`, `cpo_loss` (AlphaPO, label smoothing, simpo_gamma), the metrics, the collator.
"""

from ..scoring.concatenated_forward import PairedForward
from .paired import paired_patches

CPO = PairedForward(
    name="CPOTrainer",
    padding_value=lambda trainer: trainer.pad_token_id,
    average_log_prob=lambda trainer: trainer.loss_type in ("ipo", "simpo"),
    nll_labels=lambda trainer, input_ids, attention_mask, labels: None if trainer.cpo_alpha == 0 else labels,
    logits_drop_last=False,
)

PATCHES = paired_patches("cpo", CPO)
