# Sourced (not run) by scripts/test_gpu.sh and by the GPU benchmark commands: the environment of a bare GPU machine
# with no network.   source scripts/gpu_env.sh
# - .whl/ (scripts/gpu_wheels.sh; $WHEEL_DIR, default .whl): its top-level wheels installed offline (--no-index
#   --no-deps) into $GPU_SITE (default /tmp/site), put on PYTHONPATH ahead of the image's site-packages. Without
#   wheels nothing is installed and the packages already there are used.
# - src/ on PYTHONPATH: slimrl is not pip-installed there (its dependencies could not be resolved offline).
# - $PYTHON (default python3): the interpreter the GPU commands run, the image's own on a GPU machine (a project
#   environment's elsewhere, e.g. the CPU smoke test of scripts/gpu_bench.sh).
# Sourced again in a child of a shell that sourced it (scripts/gpu_bench.sh runs scripts/test_gpu.sh), it does nothing
# more: the exported environment is already there.
export PYTHON="${PYTHON:-python3}"
if [ -z "${SLIMRL_GPU_ENV:-}" ]; then
    GPU_SITE="${GPU_SITE:-/tmp/site}"
    WHEEL_DIR="${WHEEL_DIR:-.whl}"
    if compgen -G "$WHEEL_DIR/*.whl" > /dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_SITE" \
            "$WHEEL_DIR"/*.whl || return 1
        export PYTHONPATH="$GPU_SITE${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
    export SLIMRL_GPU_ENV=1
fi
