"""Row groups: which rows of a forward are scored together, and how many tokens a group may hold.

Input is what TRL's log-prob method gets: rows `input_ids` / `attention_mask` `[B, T]` whose last `logits_to_keep`
columns are the completion. Output is a list of row-index tensors that partition `range(B)`.

Choices, and why:
1. Order: rows sorted by prompt (ids and mask of the prompt columns), then by completion length, longest first. Rows
   of one prompt stay adjacent, so a group holds whole prompt groups where it can and a shared-prefix forward
   (slimrl_shared_prefix) still computes each prompt once per group; rows of similar length land together, so the
   columns that are padding for every row of a group (trimmed by the padding-free forward) are most of the padding.
   The order is canonical (ties broken by row index), so the same rows always form the same groups.
2. Size, given as rows (`slimrl_rows_per_group=n`): consecutive runs of n rows in that order.
3. Size, automatic: a group holds as many rows as fit in a token budget, counting each row at the group's longest
   row (what the group forwards once trimmed), and at least one row. The budget is `AUTO_GROUP_TOKENS`, lowered where
   free memory (CUDA: torch.cuda.mem_get_info plus the allocator's cached blocks; CPU: MemAvailable) would not hold a
   group of that size by `working_bytes_per_token`. Why a fixed budget and not "as many rows as fit": a group's
   forward and backward are what set the step's working memory, and past a few thousand tokens a bigger group buys
   no speed (matrix products are already wide; a group adds one forward/backward launch and one loss evaluation on
   `[B, C]` tensors), so the budget keeps the memory of long rows low at about the time of one forward. Rows shorter
   than the budget still form one group (TRL's own forward).
4. Several processes: each plans its own rows, then the processes agree on the largest group count and each splits
   its groups up to it (`agreed_count`, `split_to`): the forwards and loss evaluations, and the collectives inside
   them, pair up across processes.
The config field that sets the size, its default and its one validator live here, beside the op they guard:
`slimrl_rows_per_group` = "auto" (default) | False (TRL's one forward) | a positive number of rows.
"""

from __future__ import annotations

import torch

from .. import fields

AUTO = "auto"
ROWS_FIELD = fields.ROWS_PER_GROUP  # the GRPO/RLOO config field that sets a group's size
ROWS_DEFAULT = fields.default(ROWS_FIELD)
AUTO_GROUP_TOKENS = 4096  # tokens a group holds under "auto" (choice 3)
AUTO_FREE_FRACTION = 0.5  # share of the free memory one group's working memory may take under "auto"


def validate_rows_per_group(value):
    """The one validator of `slimrl_rows_per_group`: "auto" | False | a positive int."""
    if value is False or value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"{ROWS_FIELD} must be 'auto', False or a positive number of rows, got {value!r}.")


PADDING_FREE_FIELD = fields.PADDING_FREE  # each row group forwarded without its all-padding columns
PADDING_FREE_DEFAULT = fields.default(PADDING_FREE_FIELD)


def validate_padding_free(value):
    """The one validator of `slimrl_padding_free`: "auto" | True | False."""
    if value is True or value is False or value == AUTO:
        return value
    raise ValueError(f"{PADDING_FREE_FIELD} must be 'auto', True or False, got {value!r}.")


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real (unmasked) tokens of each row."""
    return attention_mask.sum(dim=1).tolist()


def row_order(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> list[int]:
    """Rows sorted by prompt, then completion length (longest first), then index (choice 1)."""
    width = input_ids.shape[1] - logits_to_keep
    prompts = (input_ids[:, :width] * attention_mask[:, :width]).tolist()
    prompt_masks = attention_mask[:, :width].tolist()
    completion = attention_mask[:, width:].sum(dim=1).tolist()
    return sorted(range(len(prompts)), key=lambda r: (prompts[r], prompt_masks[r], -completion[r], r))


def partition(
    order: list[int], lengths: list[int], rows: int | None = None, tokens: int | None = None
) -> list[list[int]]:
    """Consecutive groups of `order`: `rows` rows each, or as many as fit `tokens` counted at the group's longest row
    (at least one row a group)."""
    if rows is not None:
        return [order[i : i + rows] for i in range(0, len(order), rows)]
    groups, current, longest = [], [], 0
    for row in order:
        widest = max(longest, lengths[row])
        if current and (len(current) + 1) * widest > tokens:
            groups.append(current)
            current, widest = [], lengths[row]
        current.append(row)
        longest = widest
    return groups + [current] if current else groups


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can take now: CUDA's free memory plus blocks PyTorch caches; on CPU MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def working_bytes_per_token(config, activation_bytes: int, checkpointing: bool) -> int:
    """Estimated working memory of one token of a group's policy forward and backward: the layer inputs checkpointing
    keeps (without it, each layer's saved set, about 5 H + 3 I), plus one layer's transient during its recompute and
    backward (about 6 H + 4 I). The memory planner (slimrl.plan) has the detailed terms; this only sizes groups."""
    config = config.get_text_config()
    hidden, layers = config.hidden_size, config.num_hidden_layers
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    kept = hidden if checkpointing else 5 * hidden + 3 * intermediate
    return activation_bytes * (layers * kept + 6 * hidden + 4 * intermediate)


def auto_group_tokens(config, activation_bytes: int, checkpointing: bool, device: torch.device) -> int:
    """The token budget of a group under "auto" (choice 3)."""
    free = free_memory_bytes(device)
    if free is None:
        return AUTO_GROUP_TOKENS
    fit = int(AUTO_FREE_FRACTION * free) // working_bytes_per_token(config, activation_bytes, checkpointing)
    return max(1, min(AUTO_GROUP_TOKENS, fit))


def plan_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    rows: int | None = None,
    tokens: int | None = None,
    max_rows: int | None = None,
) -> list[torch.Tensor]:
    """Row-index tensors (on the rows' device) partitioning the batch; `max_rows` caps a group's rows."""
    order = row_order(input_ids, attention_mask, logits_to_keep)
    if rows is None and max_rows is not None:
        groups = partition(order, row_lengths(attention_mask), tokens=tokens)
        groups = [part for group in groups for part in partition(group, [], rows=max_rows)]
    else:
        rows = rows if max_rows is None else min(rows, max_rows)
        groups = partition(order, row_lengths(attention_mask), rows=rows, tokens=tokens)
    groups = split_to(groups, agreed_count(len(groups), input_ids.device))
    return [torch.tensor(group, dtype=torch.long, device=input_ids.device) for group in groups]


def agreed_count(count: int, device: torch.device) -> int:
    """The largest group count of all processes (this process's own when it runs alone): every process then runs
    the same number of forwards and loss evaluations, whose collectives (gathers of metrics, FSDP / ZeRO-3 weight
    gathers) must pair up across processes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    on_device = "nccl" in str(dist.get_backend())  # NCCL reduces device tensors, gloo host ones
    total = torch.tensor([count], device=device if on_device else torch.device("cpu"))
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total.item())


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split until there are `count` (the group with the most rows halved, the first such on ties), so that
    processes which must run the same number of forwards do; `count` at most the number of rows."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        widest = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
        group = groups[widest]
        half = (len(group) + 1) // 2
        groups[widest : widest + 1] = [group[:half], group[half:]]
    return groups


def column_bounds(attention_mask: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[int, int]:
    """`(first, last)`: the columns `[first, last)` hold every unmasked token of the rows. A column whose prediction
    is scored (its next column has a label) is kept, so `first` is 0 when a label sits at or before the first
    unmasked column."""
    width = attention_mask.shape[1]
    valid = attention_mask.bool().any(dim=0)
    if not bool(valid.any()):
        return 0, width
    columns = torch.nonzero(valid).flatten()
    first, last = int(columns[0]), int(columns[-1]) + 1
    if labels is not None and first > 0 and bool((labels[:, : first + 1] != -100).any()):
        first = 0
    return first, last
