"""Fixtures of the GPU tier: stock TRL around every test, IEEE fp32 matmuls, deterministic kernels where torch has
them (so a stock-vs-patched difference is the code's, not the order of atomic adds)."""

import pytest
import torch

from slimrl.patches import registry


@pytest.fixture
def unpatched():
    """Every test starts and ends with stock TRL, even when it fails half-way."""
    registry.unpatch()
    yield
    registry.unpatch()


@pytest.fixture(autouse=True)
def _ieee_fp32_and_deterministic():
    precision = torch.get_float32_matmul_precision()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_float32_matmul_precision("highest")  # no TF32: fp32 comparisons mean fp32
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama and its tokenizer on disk (what FastLanguageModel.from_pretrained loads)."""
    from slimrl.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2)
