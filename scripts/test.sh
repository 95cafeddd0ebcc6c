#!/usr/bin/env bash
# The test command: installs what the tests need into .venv (scripts/install.sh dev), then runs the default tier
# there (tiny random models, no downloads). Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` for
# the slow end-to-end tier (the embedded model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec "$PY" -m pytest -q -ra "$@"
