"""slimrl.ops.row_groups: the canonical row order, the partitions by rows and by token budget, the automatic budget
from free memory, and the column bounds the padding-free forward trims to."""

from __future__ import annotations

import torch

from slimrl.ops import row_groups as rg
from slimrl.testing import tiny_llama_config


def _batch():
    """Rows: prompts A (2 tokens, left-padded by 1) and B (3 tokens), completions of 4, 1, 3, 2 and 4 tokens."""
    prompt_a, prompt_b = [0, 7, 8], [5, 6, 9]
    prompt_mask_a, prompt_mask_b = [0, 1, 1], [1, 1, 1]
    lengths = [4, 1, 3, 2, 4]
    prompts = [prompt_a, prompt_b, prompt_a, prompt_b, prompt_b]
    prompt_masks = [prompt_mask_a, prompt_mask_b, prompt_mask_a, prompt_mask_b, prompt_mask_b]
    ids = torch.tensor([p + [11, 12, 13, 14] for p in prompts])
    mask = torch.tensor([m + [1] * n + [0] * (4 - n) for m, n in zip(prompt_masks, lengths)])
    return ids, mask


def test_order_groups_prompts_and_sorts_lengths():
    ids, mask = _batch()
    order = rg.row_order(ids, mask, 4)
    assert order == [0, 2, 4, 3, 1]  # prompt A rows (longest first), then prompt B's
    assert rg.row_order(ids.flip(0), mask.flip(0), 4) == [4 - r for r in order]  # the same rows, the same groups
    assert rg.row_lengths(mask) == [6, 4, 5, 5, 7]


def test_partition_by_rows_and_by_tokens():
    order, lengths = [0, 2, 4, 3, 1], [6, 4, 5, 5, 7]
    assert rg.partition(order, lengths, rows=2) == [[0, 2], [4, 3], [1]]
    # budget 12: a group counts each row at its longest row's length
    assert rg.partition(order, lengths, tokens=12) == [[0, 2], [4], [3, 1]]
    assert rg.partition(order, lengths, tokens=3) == [[0], [2], [4], [3], [1]]  # at least one row a group
    assert rg.partition(order, lengths, tokens=100) == [order]
    ids, mask = _batch()
    groups = rg.plan_groups(ids, mask, 4, tokens=100, max_rows=2)
    assert [g.tolist() for g in groups] == [[0, 2], [4, 3], [1]]
    assert [g.tolist() for g in rg.plan_groups(ids, mask, 4, rows=3, max_rows=2)] == [[0, 2], [4, 3], [1]]


def test_auto_budget_follows_free_memory(monkeypatch):
    config = tiny_llama_config(hidden_size=576, num_layers=30, intermediate_size=1536, num_heads=9, num_kv_heads=3)
    per_token = rg.working_bytes_per_token(config, 4, checkpointing=True)
    assert per_token == 4 * (30 * 576 + 6 * 576 + 4 * 1536)
    assert rg.working_bytes_per_token(config, 4, checkpointing=False) > 5 * per_token
    cpu = torch.device("cpu")
    monkeypatch.setattr(rg, "free_memory_bytes", lambda device: 64 * 1024**3)
    assert rg.auto_group_tokens(config, 4, True, cpu) == rg.AUTO_GROUP_TOKENS
    monkeypatch.setattr(rg, "free_memory_bytes", lambda device: 1000 * per_token)
    assert rg.auto_group_tokens(config, 4, True, cpu) == 500  # half the free memory
    monkeypatch.setattr(rg, "free_memory_bytes", lambda device: 0)
    assert rg.auto_group_tokens(config, 4, True, cpu) == 1
    monkeypatch.setattr(rg, "free_memory_bytes", lambda device: None)
    assert rg.auto_group_tokens(config, 4, True, cpu) == rg.AUTO_GROUP_TOKENS


def test_free_memory_reads_this_machine():
    free = rg.free_memory_bytes(torch.device("cpu"))
    assert free is None or free > 0


def test_column_bounds():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]])
    assert rg.column_bounds(mask) == (1, 5)
    labels = torch.full_like(mask, -100)
    labels[:, 3:5] = 7
    assert rg.column_bounds(mask, labels) == (1, 5)
    labels[1, 1] = 7  # a label at the first kept column: its prediction comes from column 0, which must stay
    assert rg.column_bounds(mask, labels) == (0, 5)
    assert rg.column_bounds(torch.zeros_like(mask)) == (0, 6)


def test_split_to_a_count_and_alone_the_own_count():
    assert rg.split_to([[0, 2], [4], [3, 1]], 3) == [[0, 2], [4], [3, 1]]
    assert rg.split_to([[0, 2, 5], [4], [3, 1]], 5) == [[0], [2], [5], [4], [3, 1]]  # the widest halved, first on ties
    assert rg.split_to([[0, 1, 2, 3]], 4) == [[0], [1], [2], [3]]
    assert rg.agreed_count(3, torch.device("cpu")) == 3  # one process: its own count
