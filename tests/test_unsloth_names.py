"""The names Unsloth's notebooks import from `unsloth`, importable from slimrl: each resolves lazily, the sandbox ones
without torch or TRL, and the shortcuts do what their slimrl counterparts do."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import slimrl
from slimrl.patches import registry

NOTEBOOK_NAMES = [
    "FastLanguageModel", "FastModel", "FastVisionModel", "PatchFastRL", "PatchDPOTrainer", "is_bfloat16_supported",
    "check_python_modules", "create_locked_down_function", "execute_with_time_limit",
]  # fmt: skip


@pytest.mark.parametrize("name", slimrl.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(slimrl, name) is not None


def test_the_notebook_names_are_exported():
    assert set(NOTEBOOK_NAMES) <= set(slimrl.__all__)


def test_sandbox_names_import_neither_torch_nor_trl():
    code = (
        "import sys; from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit; "
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(slimrl.__file__).parents[1])}  # this copy of slimrl
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "[]"


def test_patch_dpo_trainer_patches_dpo_and_orpo():
    assert not registry.is_patched("dpo")
    assert slimrl.PatchDPOTrainer() == ["dpo", "orpo"]
    assert registry.is_patched("dpo") and registry.is_patched("orpo") and not registry.is_patched("grpo")
    assert slimrl.PatchDPOTrainer() == ["dpo", "orpo"]  # idempotent
    assert slimrl.PatchKTOTrainer() == ["dpo", "kto", "orpo"]


def test_is_bfloat16_supported_is_the_precision_rule():
    from slimrl.patches.setup.precision import cuda_bf16_supported

    assert slimrl.is_bfloat16_supported() is cuda_bf16_supported()
    if not torch.cuda.is_available():
        assert slimrl.is_bfloat16_supported() is False  # on a CPU, bf16=True needs use_cpu=True as well
