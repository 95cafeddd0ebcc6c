"""The long-context config fields of the GRPO/RLOO family, and when a step's rows can be scored in groups.

The scoring itself is row_groups.py (over slimrl.ops.row_groups), the padding-free forward padding_free.py, the
tiled MLP slimrl.models.tiled_mlp. Fields, each a row of slimrl.fields (name, default), validated beside its op
(slimrl.ops.row_groups, slimrl.models.tiled_mlp):
- `slimrl_rows_per_group`: "auto" (default) | False | a positive int. False: TRL's one forward over the micro-batch;
  n: groups of n rows; "auto": groups of up to slimrl.ops.row_groups.AUTO_GROUP_TOKENS tokens, fewer where free
  memory says so (the rule and why: slimrl.ops.row_groups), where slimrl.models.long_context turns it on for the
  device and the forward's size (`choose`, recorded for describe()).
- `slimrl_padding_free`: "auto" (default) | True | False: forwards skip the columns that are padding for all their
  rows (padding_free.py); "auto" where slimrl.models.long_context turns it on.
- `slimrl_tiled_mlp`: "auto" (default) | True | False | a positive int (slimrl.models.tiled_mlp says when "auto" tiles).
Active dropout: a forward over other rows or columns draws its dropout masks in another order, so the masks are
other draws of the same distribution, not stock's draws. "auto" (groups, padding-free, tiled MLP) therefore keeps
TRL's forward while dropout is active in the model (TRL's `disable_dropout=True` switches it off), the reason logged
once; an explicit setting applies anyway.
Where groups cannot give TRL's numbers the step is scored at once, its reason logged once per trainer
(`loss_problem`): a subclass's own `_compute_loss` (not checked for groups), multimodal inputs, a MoE aux loss
(computed over the forward's rows together), an entropy mask (`top_entropy_quantile < 1`: a quantile over every
row's entropy), and training set-ups that run the backward in their own way (DeepSpeed's engine, DataParallel over
several GPUs, LOMO optimizers that step inside the backward).
"""

from __future__ import annotations

from ...models.tiled_mlp import TILED_MLP_FIELD, validate_tiled_mlp
from ...ops.row_groups import (
    PADDING_FREE_FIELD,
    ROWS_DEFAULT,
    ROWS_FIELD,
    validate_padding_free,
    validate_rows_per_group,
)
from .shared_prefix_rules import MULTIMODAL_ARGS

AUTO = "auto"
DROPOUT_REASON = "active dropout: other rows per forward would draw other dropout masks than stock"
STEPPING_OPTIMIZERS = ("lomo", "adalomo")


def dropout_problem(trainer, model, setting) -> str | None:
    """Under "auto", the reason to keep TRL's forward while dropout is active in `model` (None: go on)."""
    from ...state import transformers_model
    from .shared_prefix_rules import has_active_dropout

    if setting != AUTO:
        return None
    base = transformers_model(trainer.accelerator.unwrap_model(model))
    return DROPOUT_REASON if has_active_dropout(base) else None


def choose(trainer, lever: str, setting, rows: int, width: int):
    """The lever's decision for a forward of `rows` x `width` tokens on the trainer's device
    (slimrl.models.long_context), recorded on the trainer for describe(); `lever`: "row_groups" | "padding_free"."""
    from ...models import long_context
    from ...state import trainer_state

    device = trainer.accelerator.device.type
    if lever == "row_groups":
        choice = long_context.row_groups_choice(setting, device, rows, width)
    else:
        grouping = getattr(trainer.args, ROWS_FIELD, ROWS_DEFAULT)
        choice = long_context.padding_free_choice(setting, device, rows, width, grouping)
    state = trainer_state(trainer)
    state.lever_choices = {**(state.lever_choices or {}), lever: choice}
    return choice


def check_config(args) -> None:
    validate_rows_per_group(getattr(args, ROWS_FIELD))
    validate_padding_free(getattr(args, PADDING_FREE_FIELD))
    validate_tiled_mlp(getattr(args, TILED_MLP_FIELD))


def loss_problem(trainer, model, inputs: dict, setting, owner: str) -> str | None:
    """Why this step's rows must be scored in one forward (None: groups give TRL's numbers); `owner`: the TRL class
    whose `_compute_loss` was checked for groups (a subclass with its own loss was not)."""
    from accelerate.utils import DistributedType

    loss_of = type(trainer)._compute_loss.__qualname__
    if loss_of != f"{owner}._compute_loss":
        return f"{loss_of} is not TRL's {owner}._compute_loss, whose normalisers row groups rely on"
    present = [name for name in MULTIMODAL_ARGS if inputs.get(name) is not None]
    if present:
        return f"multimodal inputs ({', '.join(present)})"
    if getattr(trainer, "aux_loss_enabled", False):
        return "a MoE load-balancing aux loss is requested (it is computed over all rows of a forward together)"
    if getattr(trainer, "top_entropy_quantile", 1.0) < 1.0:
        return "top_entropy_quantile < 1 (its entropy threshold is a quantile over every row of the step)"
    if trainer.accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "DeepSpeed runs one backward per micro-step through its engine"
    if getattr(trainer.args, "n_gpu", 1) > 1:
        return "DataParallel over several GPUs"
    if str(getattr(trainer.args, "optim", "")).lower() in STEPPING_OPTIMIZERS:
        return "LOMO optimizers step inside the backward"
    if not hasattr(trainer, "loss_is_scaled_for_ga"):
        return "this transformers Trainer does not say how it scales the loss for gradient accumulation"
    return None


def group_size(trainer, model, setting) -> tuple[int | None, int | None]:
    """(rows, tokens) per group: the user's rows, or the automatic token budget (slimrl.ops.row_groups)."""
    import torch

    from ...ops.row_groups import auto_group_tokens
    from ...state import transformers_model

    if setting != AUTO:
        return setting, None
    base = transformers_model(trainer.accelerator.unwrap_model(model))
    args = trainer.args
    activation_bytes = 2 if (args.bf16 or args.fp16) else torch.finfo(base.dtype).bits // 8
    checkpointing = bool(getattr(args, "gradient_checkpointing", False))
    return None, auto_group_tokens(base.config, activation_bytes, checkpointing, trainer.accelerator.device)
