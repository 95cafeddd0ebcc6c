#!/usr/bin/env bash
# The default tier: installs what the tests need into .venv (scripts/install.sh dev), then runs pytest there with
# pyproject.toml's selection (not slow, vllm, gpu or distributed: tiny random models, nothing downloaded). Extra
# arguments go to pytest, e.g. -x, -k parity, tests/ops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec "$PY" -m pytest -q -ra "$@"
