"""Shared-prefix packing: each distinct prompt of a batch forwarded once, its completions attending to it.

Input is what TRL's fused log-prob head gets: rows `input_ids`, `attention_mask` and `labels` (`[B, T]`, -100 = not
scored). A row's prompt is everything before its first label (GRPO/RLOO: the prompt columns; DPO: the prompt that
chosen and rejected share). Output is any per-position head output in TRL's layout, `[B, T - 1]` (position t
predicts token t + 1), zeros where nothing is scored, as the per-row forward returns it.

Choices, and why:
1. One packed row per distinct prompt: `[prompt | c_1 | c_2 | ... | c_g]` (padded to the longest group), a 4D mask
   in which every completion sees the prompt and itself, causally, and nothing of its siblings. It is one ordinary
   model forward: gradient checkpointing (plain, non-reentrant or offloaded), LoRA, adapter switching and the
   fused log-prob head need nothing special, and the model's own attention function runs (SDPA on CPU and CUDA,
   eager too). The alternative, the prompt's keys/values computed once and passed to the completion forward as a
   cache, was measured slower and breaks under checkpointing (transformers drops `past_key_values` in checkpointed
   layers, and a replay would write the cache twice); see README.md ("Each prompt computed once") for the numbers.
2. Positions are the original column indices (`position_ids`), so RoPE sees what the per-row forward sees (TRL
   passes no position ids: a left-padded row's tokens sit at their column index, padding included).
3. Each completion segment starts with a copy of the prompt's last token: its hidden state predicts the first
   completion token, and the copy attends to exactly the keys the original does, so the value is the same and each
   completion's gradient reaches the prompt through its own copy plus the shared keys/values (one extra token per
   completion; the labels become plain `shift_labels`). A segment ends at the token before its last label.
4. Padding is not forwarded: prompt padding and completion right-padding are masked keys in the per-row forward and
   score nothing, so dropping them changes no value. A masked token inside a completion (not produced by TRL,
   handled anyway) is kept as a query and masked as a key, as in the per-row forward. `whole_rows` (ORPO/CPO, whose
   logged mean-logits metric reads every position's logits, padding included) forwards every column the same way,
   and `unpack_rows` hands the hidden states back in the rows' `[B, T]` layout (a shared position read by each row).
5. Canonical order: groups sorted by prompt, rows by completion, so the same set of rows packs to the same tensors
   whatever order TRL's shuffle gave them: the policy forward of an on-policy step then reproduces the old-policy
   forward bit for bit (ratio exactly 1, as TRL's per-row forward gives), instead of differing by rounding.
6. Mask convention: boolean for SDPA, additive float (dtype minimum) for eager, as transformers builds them; filler
   positions (packing padding) attend only to themselves so no softmax row is empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100
PROMPT_SEGMENT, FILLER_SEGMENT = 0, -1


@dataclass
class PackedPrefixBatch:
    """Packed rows `[U, L]` and the map back to TRL's `[B, T - 1]` prediction grid."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor  # original column of each packed token
    shift_labels: torch.Tensor  # label predicted from each packed position (-100: none)
    segment: torch.Tensor  # 0 prompt, k >= 1 the group's k-th completion, -1 filler
    key_valid: torch.Tensor  # bool: the token may be attended to (attention_mask of its column)
    gather_index: torch.Tensor  # [B, T - 1] flat index into the packed [U * L] grid, -1 = no value (0)
    hidden_index: torch.Tensor  # [B, T] flat packed index of the position computing each column, -1 = none
    rows_per_group: list[int]

    @property
    def tokens(self) -> int:
        """Real (non-filler) tokens forwarded."""
        return int((self.segment != FILLER_SEGMENT).sum())


def _label_spans(labels: torch.Tensor) -> tuple[list[int], list[int]]:
    """Per row: the first and last labelled column (-1, -1 for a row with no label)."""
    T = labels.shape[1]
    has = labels != IGNORE
    cols = torch.arange(T, device=labels.device)
    first = torch.where(has, cols, T).amin(dim=1)
    last = torch.where(has, cols, -1).amax(dim=1)
    first = torch.where(last >= 0, first, -1)
    return first.tolist(), last.tolist()


def layout_problem(attention_mask: torch.Tensor, labels: torch.Tensor) -> str | None:
    """Why the rows cannot be packed (None: they can)."""
    first, _ = _label_spans(labels)
    scored = [(r, f) for r, f in enumerate(first) if f >= 0]
    if not scored:
        return "no row has a scored token"
    if any(f < 1 for _, f in scored):
        return "a row is scored from its first column (no prompt)"
    if any(not bool(attention_mask[r, f - 1]) for r, f in scored):
        return "some prompt's last token is padding (prompts are not left-padded)"
    return None


def whole_rows_problem(attention_mask: torch.Tensor, attn_implementation: str) -> str | None:
    """Why whole rows cannot be packed (None: they can): under eager attention a query that sees no key (a row's
    leading padding) attends uniformly to every key of its row, so its value depends on the row's length."""
    if attn_implementation == "eager" and not bool(attention_mask[:, 0].all()):
        return "eager attention over rows that start with padding (their padding's logits depend on the row length)"
    return None


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> list[list[int]]:
    """Scored rows with identical prompts (the ids and mask before the first label), grouped; groups sorted by
    prompt, rows by completion. Rows with no label are left out."""
    first, _ = _label_spans(labels)
    mask = attention_mask.to(input_ids.dtype)
    keyed = []
    for row, f in enumerate(first):
        if f >= 0:
            prompt = (f, input_ids[row, :f].tolist(), mask[row, :f].tolist())
            keyed.append((prompt, (input_ids[row, f:].tolist(), mask[row, f:].tolist()), row))
    groups: dict[tuple, list[int]] = {}
    for prompt, _, row in sorted(keyed, key=lambda item: item[:2]):
        groups.setdefault((prompt[0], tuple(prompt[1]), tuple(prompt[2])), []).append(row)
    return list(groups.values())


def _group_parts(group: list[int], p: int, last: list[int], T: int, valid: torch.Tensor, whole_rows: bool):
    """One packed row: its source rows, source columns and segment ids, and each row's segment offset in it."""
    cols = torch.arange(T, device=valid.device)
    prompt_cols = cols[: p - 1] if whole_rows else cols[: p - 1][valid[group[0], : p - 1]]
    src, col, seg, offsets = (
        [torch.full_like(prompt_cols, group[0])],
        [prompt_cols],
        [torch.full_like(prompt_cols, PROMPT_SEGMENT)],
        {},
    )
    offset = prompt_cols.numel()
    for k, row in enumerate(group, start=1):
        seg_cols = cols[p - 1 : T if whole_rows else last[row]]  # whole rows: every column; else up to the last label
        offsets[row] = offset
        src.append(torch.full_like(seg_cols, row))
        col.append(seg_cols)
        seg.append(torch.full_like(seg_cols, k))
        offset += seg_cols.numel()
    return torch.cat(src), torch.cat(col), torch.cat(seg), offsets


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    groups: list[list[int]] | None = None,
    whole_rows: bool = False,
) -> PackedPrefixBatch:
    """Lay out one packed row per prompt group (see the module docstring); `layout_problem` must be None.

    `whole_rows`: every column of the grouped rows is forwarded (prompt and trailing padding as queries that no one
    attends to), so `hidden_index` maps every column; else only what predicts a label (choice 4).
    """
    B, T = input_ids.shape
    device = input_ids.device
    groups = prompt_groups(input_ids, attention_mask, labels) if groups is None else groups
    first, last = _label_spans(labels)
    valid = attention_mask.bool()
    parts = [_group_parts(group, first[group[0]], last, T, valid, whole_rows) for group in groups]
    L = max(part[1].numel() for part in parts)

    def padded(index, fill):
        return torch.stack([torch.cat([x[index], x[index].new_full((L - x[index].numel(),), fill)]) for x in parts])

    src, col, segment = padded(0, 0), padded(1, 0), padded(2, FILLER_SEGMENT)
    filler = segment == FILLER_SEGMENT
    ids = input_ids[src, col].masked_fill(filler, int(input_ids[groups[0][0], 0]))
    key_valid = valid[src, col] & ~filler
    predicts = (segment > PROMPT_SEGMENT) & (col < T - 1)  # a whole row's last column predicts nothing
    shift_labels = torch.where(predicts, labels[src, (col + 1).clamp(max=T - 1)], IGNORE)
    hidden_index = torch.full((B, T), -1, dtype=torch.long, device=device)
    flat = torch.arange(L, device=device)
    for u, (_, part_cols, part_seg, offsets) in enumerate(parts):
        prompt = part_seg == PROMPT_SEGMENT
        for row, offset in offsets.items():
            hidden_index[row, part_cols[prompt]] = u * L + flat[: int(prompt.sum())]
            own = part_seg == part_seg[offset]
            hidden_index[row, part_cols[own]] = u * L + flat[offset : offset + int(own.sum())]
    gather_index = hidden_index[:, :-1].clone()
    for row, f in enumerate(first):  # a prediction exists from the prompt's last token up to the last label
        if f >= 0:
            gather_index[row, : f - 1] = -1
            gather_index[row, last[row] :] = -1
        else:
            gather_index[row] = -1
    return PackedPrefixBatch(
        ids,
        col.masked_fill(filler, 0),
        shift_labels,
        segment,
        key_valid,
        gather_index,
        hidden_index,
        [len(g) for g in groups],
    )


def _segment_starts(segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the packed index where its segment starts (prompt: 0); per row, the prompt's token count."""
    U, L = segment.shape
    idx = torch.arange(L, device=segment.device).expand(U, L)
    is_start = torch.ones_like(segment, dtype=torch.bool)
    is_start[:, 1:] = segment[:, 1:] != segment[:, :-1]
    is_start |= segment == FILLER_SEGMENT  # each filler is a segment of its own
    starts = torch.where(is_start, idx, 0).cummax(dim=1).values
    return torch.where(segment == PROMPT_SEGMENT, 0, starts), (segment == PROMPT_SEGMENT).sum(dim=1)


def attention_mask_4d(packed: PackedPrefixBatch, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """`[U, 1, L, L]` mask: a query sees the valid keys of the prompt and of its own segment, causally.

    Segments are contiguous and their columns increase along the packed row, so "earlier-or-equal column of the
    prompt or of the own segment" is "packed index <= the query's, and >= the start of its segment or inside the
    prompt": four in-place passes over one `[U, L, L]` boolean tensor. Fillers attend to themselves.
    """
    segment, key_valid = packed.segment, packed.key_valid
    U, L = segment.shape
    idx = torch.arange(L, device=segment.device)
    starts, prompt_len = _segment_starts(segment)
    allowed = idx[None, None, :] >= starts[:, :, None]
    allowed |= idx[None, None, :] < prompt_len[:, None, None]
    allowed &= idx[None, None, :] <= idx[None, :, None]
    allowed &= key_valid[:, None, :]
    allowed.diagonal(dim1=1, dim2=2).logical_or_(segment == FILLER_SEGMENT)
    allowed = allowed[:, None]
    if attn_implementation == "eager":
        return torch.zeros((), dtype=dtype, device=segment.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed


def unpack(values: torch.Tensor, packed: PackedPrefixBatch) -> torch.Tensor:
    """`[U, L]` per-position values -> `[B, T - 1]` prediction grid (zeros where no label was scored)."""
    index = packed.gather_index
    picked = values.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, picked, torch.zeros((), dtype=values.dtype, device=values.device))


def unpack_rows(values: torch.Tensor, packed: PackedPrefixBatch) -> torch.Tensor:
    """`[U, L, ...]` per-position values (hidden states) -> `[B, T, ...]` in the rows' columns (zeros where none).

    A shared prompt position is read by every row of its group, so its gradient is the sum of theirs."""
    index = packed.hidden_index
    picked = values.reshape(-1, *values.shape[2:])[index.clamp(min=0)]
    present = (index >= 0).reshape(*index.shape, *[1] * (values.dim() - 2))
    return torch.where(present, picked, torch.zeros((), dtype=values.dtype, device=values.device))


def model_inputs(packed: PackedPrefixBatch, model) -> dict:
    """The keyword inputs of `model` (a transformers model) for the packed rows: ids, 4D mask, positions."""
    mask = attention_mask_4d(packed, model.config._attn_implementation, model.get_input_embeddings().weight.dtype)
    return dict(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids)
