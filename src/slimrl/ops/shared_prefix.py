"""Shared-prefix packing: each distinct prompt of a batch forwarded once, its completions attending to it.

Input is what TRL's `_get_per_token_logps_and_entropies` gets: rows `[prompt | completion]` (`input_ids`,
`attention_mask`, `[B, T]`), the last `logits_to_keep = C` columns being the completion. Output is the per-token
log-probs (and entropies) of the completion columns, `[B, C]`, zeros where the label is padding, as TRL returns them.

Choices, and why:
1. One packed row per distinct prompt: `[prompt | c_1 | c_2 | ... | c_g]` (padded to the longest group), a 4D mask
   in which every completion sees the prompt and itself, causally, and nothing of its siblings. It is one ordinary
   model forward: gradient checkpointing (plain, non-reentrant or offloaded), LoRA, adapter switching and the
   fused log-prob head need nothing special, and the model's own attention function runs (SDPA on CPU and CUDA,
   eager too). The alternative, the prompt's keys/values computed once and passed to the completion forward as a
   cache, was measured slower and breaks under checkpointing (transformers drops `past_key_values` in checkpointed
   layers, and a replay would write the cache twice); see docs/README-shared-prefix.md for the numbers.
2. Positions are the original column indices (`position_ids`), so RoPE sees what the per-row forward sees (TRL
   passes no position ids: a left-padded row's tokens sit at their column index, padding included).
3. Each completion segment starts with a copy of the prompt's last token (column P-1): its hidden state predicts the
   first completion token, and the copy attends to exactly the keys the original does, so the value is the same
   and each completion's gradient reaches the prompt through its own copy plus the shared keys/values (one extra
   token per completion; the labels become plain `shift_labels`).
4. Padding is not forwarded: prompt left-padding and completion right-padding are masked keys in the per-row forward
   and their labels are -100, so dropping them changes no value. A masked token inside a completion (not produced
   by TRL, handled anyway) is kept as a query and masked as a key, as in the per-row forward.
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
    """Packed rows `[U, L]` and the map back to the `[B, C]` completion grid."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor  # original column of each packed token
    shift_labels: torch.Tensor  # label predicted from each packed position (-100: none)
    segment: torch.Tensor  # 0 prompt, k >= 1 the group's k-th completion, -1 filler
    key_valid: torch.Tensor  # bool: the token may be attended to (attention_mask of its column)
    gather_index: torch.Tensor  # [B, C] flat index into the packed [U * L] grid, -1 = no value (0)
    rows_per_group: list[int]

    @property
    def tokens(self) -> int:
        """Real (non-filler) tokens forwarded."""
        return int((self.segment != FILLER_SEGMENT).sum())


def layout_problem(attention_mask: torch.Tensor, logits_to_keep: int) -> str | None:
    """Why the batch cannot be packed (None: it can)."""
    prompt_len = attention_mask.shape[1] - logits_to_keep
    if prompt_len < 1:
        return "the rows have no prompt columns"
    if not bool(attention_mask[:, prompt_len - 1].all()):
        return "some prompt's last column is padding (prompts are not left-padded)"
    return None


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> list[list[int]]:
    """Rows with identical prompt columns (ids and mask), grouped; groups sorted by prompt, rows by completion."""
    prompt_len = input_ids.shape[1] - logits_to_keep
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    _, inverse = torch.unique(torch.cat([rows[:, :prompt_len], rows[:, input_ids.shape[1]:][:, :prompt_len]], 1),
                              dim=0, return_inverse=True)
    completions = torch.cat([input_ids[:, prompt_len:], attention_mask[:, prompt_len:].to(input_ids.dtype)], 1)
    order = sorted(range(len(rows)), key=lambda r: (int(inverse[r]), completions[r].tolist()))
    groups: dict[int, list[int]] = {}
    for row in order:
        groups.setdefault(int(inverse[row]), []).append(row)
    return list(groups.values())


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
         groups: list[list[int]] | None = None) -> PackedPrefixBatch:
    """Lay out one packed row per prompt group (see the module docstring); `layout_problem` must be None."""
    B, T = input_ids.shape
    P, device = T - logits_to_keep, input_ids.device
    groups = prompt_groups(input_ids, attention_mask, logits_to_keep) if groups is None else groups
    valid = attention_mask.bool()
    cols = torch.arange(T, device=device)
    # Last valid completion column per row (P - 1 when the completion is all padding: nothing to score)
    last = torch.where(valid[:, P:], cols[P:], P - 1).amax(dim=1).tolist()
    src_rows, src_cols, segments, seg_ends, starts = [], [], [], [], {}
    for group in groups:
        prompt_cols = cols[:P - 1][valid[group[0], :P - 1]]
        row_src = [torch.full_like(prompt_cols, group[0])]
        row_cols, row_seg = [prompt_cols], [torch.full_like(prompt_cols, PROMPT_SEGMENT)]
        row_end = [torch.full_like(prompt_cols, -1)]
        offset = prompt_cols.numel()
        for k, row in enumerate((r for r in group if last[r] >= P), start=1):
            seg_cols = cols[P - 1:last[row] + 1]
            starts[row] = (len(src_rows), offset)
            row_src.append(torch.full_like(seg_cols, row))
            row_cols.append(seg_cols)
            row_seg.append(torch.full_like(seg_cols, k))
            row_end.append(torch.full_like(seg_cols, last[row]))
            offset += seg_cols.numel()
        src_rows.append(torch.cat(row_src))
        src_cols.append(torch.cat(row_cols))
        segments.append(torch.cat(row_seg))
        seg_ends.append(torch.cat(row_end))
    L = max(x.numel() for x in src_cols)

    def padded(parts, fill):
        return torch.stack([torch.cat([x, x.new_full((L - x.numel(),), fill)]) for x in parts])

    src, col = padded(src_rows, 0), padded(src_cols, 0)
    segment, seg_end = padded(segments, FILLER_SEGMENT), padded(seg_ends, -1)
    filler = segment == FILLER_SEGMENT
    ids = input_ids[src, col].masked_fill(filler, int(input_ids[0, P - 1]))
    key_valid = valid[src, col] & ~filler
    nxt = (col + 1).clamp(max=T - 1)
    has_label = (segment > PROMPT_SEGMENT) & (col < seg_end) & valid[src, nxt]
    shift_labels = torch.where(has_label, input_ids[src, nxt], IGNORE)
    gather_index = torch.full((B, logits_to_keep), -1, dtype=torch.long, device=device)
    for row, (u, start) in starts.items():
        n = last[row] - P + 1
        gather_index[row, :n] = u * L + start + torch.arange(n, device=device)
    return PackedPrefixBatch(ids, col.masked_fill(filler, 0), shift_labels, segment, key_valid, gather_index,
                             [len(g) for g in groups])


def attention_mask_4d(packed: PackedPrefixBatch, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """`[U, 1, L, L]` mask: a query sees valid keys at earlier-or-equal columns of the prompt or of its own segment."""
    seg, col, key_valid = packed.segment, packed.position_ids, packed.key_valid
    k_seg = seg[:, None, :]
    allowed = key_valid[:, None, :] & (col[:, None, :] <= col[:, :, None])
    allowed &= (k_seg == PROMPT_SEGMENT) | (k_seg == seg[:, :, None])
    L = seg.shape[1]
    eye = torch.eye(L, dtype=torch.bool, device=seg.device)
    allowed = torch.where((seg == FILLER_SEGMENT)[:, :, None], eye, allowed)[:, None]
    if attn_implementation == "eager":
        return torch.zeros((), dtype=dtype, device=seg.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed


def unpack(values: torch.Tensor, packed: PackedPrefixBatch) -> torch.Tensor:
    """`[U, L]` per-position values -> `[B, C]` completion grid (zeros where no label was scored)."""
    index = packed.gather_index
    picked = values.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, picked, torch.zeros((), dtype=values.dtype, device=values.device))
