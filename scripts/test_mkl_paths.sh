#!/usr/bin/env bash
# The MKL-paths tier: the parity tests (stock vs patched, docs/parity.md) on two more of MKL's code paths than the
# CPU's own, so a machine of either CPU vendor checks the other's. MKL rounds float32 products in another order on an
# Intel CPU than on an AMD one, and a case tuned on one failed on the other. Runs in .venv, one thread, every parity
# case of the default and slow tiers:
#   1. MKL_CBWR=COMPATIBLE: MKL's reproducibility baseline, the same kernels on every x86 CPU;
#   2. LD_PRELOAD of scripts/mkl_intel_path.c built with cc: the Intel path (an Intel CPU's default) on any x86 CPU,
#      first checked to round otherwise than (1) (else the run fails: nothing would be tested).
# Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
PARITY=(tests/patches tests/ops -m "not vllm and not gpu and not distributed and not notebooks and not nightly"
        -k "parity or shared or equivalence or control or row_group or ops")

build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
if ! command -v cc >/dev/null 2>&1; then
    echo "test_mkl_paths: no C compiler (cc) to build scripts/mkl_intel_path.c: apt-get install gcc" >&2
    exit 1
fi
cc -shared -fPIC -O2 -o "$build/libmkl_intel_path.so" scripts/mkl_intel_path.c
INTEL_PATH="$build/libmkl_intel_path.so"

gemm_digest() {  # a float32 product whose rounding depends on MKL's path, printed to the last bit
    "$PY" -c 'import torch; g = torch.Generator().manual_seed(0)
a, b = torch.randn(333, 4097, generator=g), torch.randn(4097, 517, generator=g)
print((a @ b).double().sum().item())'
}
baseline=$(MKL_CBWR=COMPATIBLE gemm_digest)
intel=$(LD_PRELOAD="$INTEL_PATH" gemm_digest)
if [ "$baseline" = "$intel" ]; then
    echo "test_mkl_paths: the preloaded library did not change MKL's rounding ($baseline on both paths)" >&2
    exit 1
fi
echo "MKL rounds one float32 product to $baseline (COMPATIBLE) and to $intel (Intel path)" >&2

failed=0
echo "=== parity on MKL's baseline path (MKL_CBWR=COMPATIBLE) ===" >&2
MKL_CBWR=COMPATIBLE "$PY" -m pytest -q -ra "${PARITY[@]}" "$@" || failed=1
echo "=== parity on MKL's Intel path (LD_PRELOAD=scripts/mkl_intel_path.c) ===" >&2
LD_PRELOAD="$INTEL_PATH" "$PY" -m pytest -q -ra "${PARITY[@]}" "$@" || failed=1
exit $failed
