#!/usr/bin/env bash
# DeepSpeed for the distributed tier's ZeRO-2/3 CPU runs, in its own virtual environment (.venv-deepspeed, seeing the
# system packages), so the default environment stays without it (transformers and TRL change paths when deepspeed
# is importable). Idempotent; ~1-2 minutes the first time (DeepSpeed builds no ops at install: DS_BUILD_OPS=0).
# Usage: bash scripts/install_deepspeed.sh      then .venv-deepspeed/bin/python has deepspeed + slimrl.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=${SLIMRL_DEEPSPEED_VENV:-.venv-deepspeed}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
    DS_BUILD_OPS=0 "$PY" -m pip install -q "deepspeed==0.19.8" 2> >(grep -v "^WARNING: Location" >&2)
fi
"$PY" -m pip install -q --no-deps -e . 2> >(grep -v "^WARNING: Location" >&2)
"$PY" -c "import deepspeed, slimrl; print('deepspeed', deepspeed.__version__, 'ready in', '$VENV')" 2>&1 | tail -1
