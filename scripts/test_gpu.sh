#!/usr/bin/env bash
# The GPU tier: every test marked `gpu` (tests/gpu/), one command, on a bare GPU machine with no network.
#   bash scripts/test_gpu.sh [pytest args]          e.g. -x, -k parity, tests/gpu/test_gpu_ops.py
#
# - scripts/gpu_env.sh (sourced) installs the wheels of .whl/ offline and puts them and src/ on PYTHONPATH.
# - A preflight prints the GPU and the versions and stops with the missing package named, or with each library
#   outside slimrl/versions.py's ranges named (slimrl would refuse it at its first use), before pytest starts.
#   Without CUDA it stops too (exit 2), unless ALLOW_NO_GPU=1: then every test is collected and skips with its reason.
# - Measured numbers (parity errors, peaks) go as JSON lines to $SLIMRL_GPU_REPORT (default: none).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu_env.sh
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS (the parity tests)

"$PYTHON" - <<'EOF'
import importlib
import importlib.metadata
import os
import sys

import torch

cuda = torch.cuda.is_available()
needed = ["transformers", "trl", "peft", "accelerate", "datasets", "pytest", "slimrl"]
needed += ["triton", "bitsandbytes"] if cuda else []  # the Triton path and the 4-bit tests run only on the GPU
versions, missing = {"torch": torch.__version__}, []
for name in needed:
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - report every missing piece at once
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
try:  # optional (the `gpu` extra): without it tests/gpu/test_gpu_liger.py skips
    importlib.import_module("liger_kernel")
    versions["liger-kernel"] = importlib.metadata.version("liger-kernel")
except Exception as exc:  # noqa: BLE001
    versions["liger-kernel"] = f"absent ({type(exc).__name__}: its tests skip)"
print("python", sys.version.split()[0], "|", " ".join(f"{k} {v}" for k, v in versions.items()))
if missing:
    sys.exit("missing: " + "; ".join(missing) + " (run scripts/gpu_wheels.sh where pip works, copy .whl/ here)")
import datasets  # noqa: E402 (after the check above)

datasets.disable_progress_bars()
datasets.Dataset.from_dict({"a": [1, 2]}).map(lambda row: {"b": row["a"] + 1})  # pyarrow of the image is usable
print("slimrl from", os.path.dirname(importlib.import_module("slimrl").__file__))
from slimrl.versions import problems  # noqa: E402 (the same verdict slimrl's API gives at first use)

refused = problems()
if refused:
    sys.exit("slimrl refuses these library versions: " + "; ".join(refused) + " (slimrl/versions.py)")
if cuda:
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.1f} GiB, CUDA {torch.version.cuda}, "
          f"bf16 {torch.cuda.is_bf16_supported()}")
elif os.environ.get("ALLOW_NO_GPU") != "1":
    print("no CUDA GPU (torch.cuda.is_available() is False); ALLOW_NO_GPU=1 collects the tier and skips it")
    sys.exit(2)
else:
    print("no CUDA GPU: the tier is collected and skipped (ALLOW_NO_GPU=1)")
EOF

# tests/gpu unless paths are given: other folders import CPU-side extras (gguf) when collected
exec "$PYTHON" -m pytest -q -ra -m gpu -p no:cacheprovider "${@:-tests/gpu}"
