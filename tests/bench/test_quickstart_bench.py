"""bench/quickstart.py finds the README's quick start and seeds it without changing anything else (the run itself is
the slow tier's tests/test_readme.py, which checks that the quick start learns)."""

from __future__ import annotations

import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import quickstart  # noqa: E402


def test_the_quick_start_block_is_found_and_seeded():
    block = quickstart.quick_start_block()
    assert "trainer.train()" in block and "held-out accuracy" in block
    assert quickstart.with_seed(block, 42) == block  # TRL's default seed: the block as written
    seeded = quickstart.with_seed(block, 3)
    assert seeded.count("seed=3,") == 1 and seeded.replace("    seed=3,\n", "", 1) == block
