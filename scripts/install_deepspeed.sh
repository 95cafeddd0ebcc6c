#!/usr/bin/env bash
# DeepSpeed for the distributed tier's ZeRO-2/3 CPU runs, in its own virtual environment (.venv-deepspeed, layered
# on the project's .venv: scripts/venv.sh), so the project environment stays without it (transformers and TRL change
# paths when deepspeed is importable). Idempotent; ~1-2 minutes the first time (DeepSpeed builds no ops at install:
# DS_BUILD_OPS=0).
# Usage: bash scripts/install_deepspeed.sh      then .venv-deepspeed/bin/python has deepspeed + slimrl.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
DS_VENV=${SLIMRL_DEEPSPEED_VENV:-.venv-deepspeed}
layered_venv "$DS_VENV"
PY="$DS_VENV/bin/python"
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
    DS_BUILD_OPS=0 pip_install "$PY" "deepspeed==0.19.8"
fi
pip_install "$PY" --no-deps -e .
"$PY" -c "import deepspeed, slimrl; print('deepspeed', deepspeed.__version__, 'ready in', '$DS_VENV')" 2>&1 | tail -1
