"""The chunking knob of slimrl's log-prob heads (`slimrl_num_chunks`, Unsloth's `unsloth_num_chunks`): its values,
its one validator, and how a token count is cut into row chunks.

- AUTO_CHUNKS (-1): the head picks the chunk size from a scratch-memory budget (AUTO_BUDGET_BYTES for all fp32 row
  buffers of one fold: 128 MiB = 220 tokens at V=152k with two buffers, 1000+ tokens at V=32k).
- N >= 1: the scored tokens are split into N balanced chunks (more chunks, less memory, same numbers).
The value is stored on the model (slimrl.state.ModelState.num_chunks) and read by the heads at every call.
"""

from __future__ import annotations

import math

from .. import fields
from ..state import AUTO_CHUNKS, model_state

AUTO_BUDGET_BYTES = 128 * 1024**2


def validate_num_chunks(value, name: str = fields.NUM_CHUNKS) -> int:
    """`value` if it is AUTO_CHUNKS or an integer >= 1, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not (value == AUTO_CHUNKS or value >= 1):
        raise ValueError(f"{name} must be {AUTO_CHUNKS} (automatic) or an integer >= 1, got {value!r}.")
    return value


def set_num_chunks(model, num_chunks: int) -> None:
    """Store the knob on `model` (the transformers model under PEFT), where the heads read it at every call."""
    model_state(model).num_chunks = validate_num_chunks(num_chunks)


def num_chunks_of(model) -> int:
    """The knob stored on `model`, AUTO_CHUNKS when none was set."""
    state = model_state(model, create=False)
    return AUTO_CHUNKS if state is None else state.num_chunks


def resolve_num_chunks(num_tokens: int, vocab: int, num_chunks: int, buffers: int = 2) -> int:
    """Chunk count: `num_chunks >= 1` is taken as is (capped at one token per chunk), AUTO picks from the budget."""
    if num_tokens <= 0:
        return 1
    if num_chunks is not None and num_chunks >= 1:
        return min(num_chunks, num_tokens)
    rows = max(1, AUTO_BUDGET_BYTES // (buffers * 4 * max(vocab, 1)))
    return math.ceil(num_tokens / rows)


def chunk_bounds(num_tokens: int, num_chunks: int) -> list[tuple[int, int]]:
    """`num_chunks` contiguous, balanced (sizes differ by at most one) row ranges, like `torch.tensor_split`."""
    k = max(1, min(num_chunks, num_tokens))
    base, extra = divmod(num_tokens, k)
    bounds, start = [], 0
    for i in range(k):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return [b for b in bounds if b[1] > b[0]]
