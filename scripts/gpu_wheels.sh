#!/usr/bin/env bash
# Downloads, on a machine where pip reaches an index, the wheels the GPU tier needs on a GPU machine with no network
# into .whl/ (git-ignored; copy it along with the checkout). scripts/test_gpu.sh installs them there.
#
# The GPU image (python 3.12, torch 2.11 cu130, transformers 5.17, peft, accelerate, triton, pytest, pyarrow, pandas,
# xxhash, fsspec, huggingface-hub 1.33, psutil, pyyaml) lacks: trl, datasets and datasets' dill and multiprocess, and
# bitsandbytes (the 4-bit QLoRA test; its wheel holds libbitsandbytes_cuda130.so), and liger-kernel (the `gpu` extra:
# tests/gpu/test_gpu_liger.py; a pure-Python wheel, its torch and triton are the image's). gguf and matplotlib are not
# needed by the GPU tier. Versions are pinned to what the CPU suite runs here; one version of each (two stop the install).
# The total is checked against WHEEL_BUDGET_MIB (default 50), to keep the folder small enough to copy along.
# EXTRA_WHEELS adds pins, e.g. to run the tier on the transformers the CPU suite uses (13 MiB more):
#   EXTRA_WHEELS="transformers==5.23.0" WHEEL_BUDGET_MIB=60 bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 bitsandbytes==0.50.2 liger-kernel==0.8.5
    ${EXTRA_WHEELS:-})
BUDGET_MIB="${WHEEL_BUDGET_MIB:-50}"
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done

git check-ignore -q .whl/probe.whl || { echo "/.whl/ must be git-ignored (add it to .gitignore)" >&2; exit 1; }
mkdir -p .whl
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"

count=$(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
    echo "expected ${#WHEELS[@]} wheels in .whl/, found $count" >&2
    exit 1
fi
total=$(find .whl -maxdepth 1 -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s}')
mib=$(( (total + 1048575) / 1048576 ))
ls -l .whl/*.whl
echo "total: ${mib} MiB (budget ${BUDGET_MIB} MiB)"
if [ "$mib" -gt "$BUDGET_MIB" ]; then
    echo "the wheels exceed the budget of ${BUDGET_MIB} MiB (WHEEL_BUDGET_MIB)" >&2
    exit 1
fi
