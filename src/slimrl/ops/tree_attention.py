"""Tree attention without FlashAttention-3: AsyncGRPO's packed prefix-trie rows on any device torch runs on.

TRL's AsyncGRPOTrainer packs a micro-batch into one row per rank, a prefix trie laid out in segments
(trl.experimental.async_grpo.packing.TreeRow.pack): each segment attends causally to the keys of its root-to-segment
path, `tree_kv_index[cu_seqlens_k[s]:cu_seqlens_k[s + 1]]`, whose last entries are the segment itself. TRL computes
that with the FA3 varlen kernel fetched from the Hub (`kernels-community/flash-attn3`), CUDA only. This is the same
attention as one SDPA call over the packed row with a block mask: query i of segment s (length Lq, path length Lk)
sees path positions 0 .. Lk - Lq + i (FlashAttention's causal alignment for Lk > Lq, bottom right), and with a
sliding window only the last `window` of them. Same arguments and output layout as TRL's `tree_attention`
(attention output [1, N, heads, head_dim], no weights); the numbers are those of SDPA in the query's dtype (FA3 casts
a float32 model's activations to half precision; this does not).
"""

from __future__ import annotations

import torch


def tree_mask(
    num_tokens: int,
    tree_kv_index: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """[N, N] boolean mask: True where a packed query may attend a packed key."""
    device = tree_kv_index.device
    q_bounds, k_bounds = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rows, cols = [], []
    for s in range(len(q_bounds) - 1):
        q_start, q_len = q_bounds[s], q_bounds[s + 1] - q_bounds[s]
        path = tree_kv_index[k_bounds[s] : k_bounds[s + 1]]
        offset = len(path) - q_len  # keys before the segment's first query (its ancestors)
        depth = torch.arange(len(path), device=device)
        query = torch.arange(q_len, device=device)[:, None]
        allowed = depth[None, :] <= offset + query
        if sliding_window is not None:
            allowed &= depth[None, :] > offset + query - sliding_window
        q_index, k_index = allowed.nonzero(as_tuple=True)
        rows.append(q_start + q_index)
        cols.append(path[k_index])
    mask = torch.zeros(num_tokens, num_tokens, dtype=torch.bool, device=device)
    mask[torch.cat(rows), torch.cat(cols)] = True
    return mask


def tree_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    tree_max_seqlen_q=None,
    tree_max_seqlen_k=None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """TRL's `tree_attention` signature: query [1, heads, N, d], key / value [1, kv_heads, N, d]."""
    if softcap:
        raise NotImplementedError(
            f"attention logit softcapping (softcap={softcap}) is not supported by slimrl's tree attention; "
            "TRL's FlashAttention-3 kernel (CUDA) supports it."
        )
    num_tokens = query.shape[2]
    mask = tree_mask(num_tokens, tree_kv_index, tree_cu_seqlens_q, tree_cu_seqlens_k, sliding_window)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.to(query.dtype), value.to(query.dtype), attn_mask=mask, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None
