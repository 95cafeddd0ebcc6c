#!/usr/bin/env bash
# The vLLM tier: installs vLLM into .venv-vllm (scripts/install_vllm.sh; heavy, ~3 minutes the first time), then
# runs the tests marked `vllm` there. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_vllm.sh
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec .venv-vllm/bin/python -m pytest -q -ra -m vllm -p no:cacheprovider "$@"
