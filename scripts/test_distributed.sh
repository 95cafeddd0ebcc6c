#!/usr/bin/env bash
# The distributed tier: tests marked `distributed` (tests/distributed/), each starting 2 CPU processes with torchrun
# (gloo, OMP_NUM_THREADS=1 each): DDP and DeepSpeed ZeRO-2/3 runs of patched GRPO and DPO against 1 process at twice
# the batch, and slimrl's head under FSDP2. ~6-8 minutes on 2 cores. Extra arguments go to pytest, e.g. -k grpo.
# DeepSpeed lives in .venv-deepspeed (scripts/install_deepspeed.sh); if it cannot be installed the tier runs without
# it and the ZeRO cases are reported as skipped, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
if bash scripts/install_deepspeed.sh; then
    PY=.venv-deepspeed/bin/python
else
    echo "DeepSpeed could not be installed: the ZeRO cases will be skipped" >&2
fi
exec "$PY" -m pytest -q -ra -m distributed tests/distributed "$@"
