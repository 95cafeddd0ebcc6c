#!/usr/bin/env bash
# The test command: installs what the tests need, then runs the default tier (tiny random models, no downloads).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` for the slow end-to-end tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec python3 -m pytest -q -ra "$@"
