"""ORPO: TRL 1.16's experimental ORPOTrainer (`trl.experimental.orpo`), patched to never hold `[2B, T, V]` logits.

Patched: `ORPOTrainer.concatenated_forward` (concatenated_forward.py, declared below: log-probs averaged over the
completion labels; the chosen NLL over every attended token, prompt included; the mean-logits metric without the last
position, as stock slices `logits[:, :-1]`; the prompt forwarded once for chosen and rejected under
`slimrl_shared_prefix`); the set-up shared with DPO/KTO (offline.py: `slimrl_num_chunks`, `slimrl_shared_prefix`,
precision, checkpointing, `max_length`, the `peak_memory_gb` metric in `_stored_metrics`); `trl.ORPOConfig` /
`trl.ORPOTrainer`, which TRL 1.16 has only under `trl.experimental.orpo` while Unsloth scripts write
`from trl import ORPOConfig, ORPOTrainer`: reversible aliases (unpatch deletes them; a TRL that defines them itself is
left alone).
`tokenize_row`: with `max_prompt_length` set, TRL 0.2x's prompt-then-answer cut (prompt_limit.py).
TRL's own: `get_batch_loss_metrics`, `odds_ratio_loss`, the metrics, the data collator.
"""

import torch

from ..scoring.concatenated_forward import PairedForward
from .paired import paired_patches

ORPO = PairedForward(
    name="ORPOTrainer",
    padding_value=lambda trainer: trainer.padding_value,
    average_log_prob=lambda trainer: True,
    nll_labels=lambda trainer, input_ids, attention_mask, labels: torch.where(attention_mask == 1, input_ids, -100),
    logits_drop_last=True,
)

PATCHES = paired_patches("orpo", ORPO)
