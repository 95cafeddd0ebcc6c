#!/usr/bin/env bash
# The distributed tier: tests marked `distributed` (tests/distributed/), each starting 2 CPU processes with torchrun
# (gloo, OMP_NUM_THREADS=1 each), ~3-4 minutes on 2 cores. Extra arguments go to pytest.
#   bash scripts/test_distributed.sh            bash scripts/test_distributed.sh -k grpo
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
exec python3 -m pytest -q -ra -m distributed tests/distributed "$@"
