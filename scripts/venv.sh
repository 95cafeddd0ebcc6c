# Sourced (not run) by the scripts that install or run slimrl: the project's virtual environment.
#   source scripts/venv.sh; project_venv     then "$PY" is the environment's python and "$VENV" its folder.
#
# - The environment is .venv at the repository root (SLIMRL_VENV=DIR to put it elsewhere), made with the standard
#   library's venv module from the base interpreter SLIMRL_BASE_PYTHON (default: python3 on PATH), which must be
#   Python >= 3.11 (TRL 1.16 needs it). pip installs only into that environment, never into the base interpreter, so
#   a system Python that refuses pip (PEP 668 "externally-managed-environment", Debian 12+, Ubuntu 23.04+) is fine.
# - A venv reads pip's own configuration (/etc/pip.conf, PIP_* variables: a wheelhouse, a mirror, constraints).
# - layered_venv DIR makes a second environment for a heavy optional tier (.venv-vllm, .venv-deepspeed) that sees
#   every package of the project environment and shadows only what it installs itself (a layer on a layered
#   environment sees every layer below it).
BASE_PYTHON="${SLIMRL_BASE_PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

check_base_python() {
    if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
        echo "slimrl: no '$BASE_PYTHON' found: install Python >= 3.11 or set SLIMRL_BASE_PYTHON=/path/to/python3" >&2
        return 1
    fi
    if ! "$BASE_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "slimrl needs Python >= 3.11 (TRL 1.16 does); $BASE_PYTHON is $("$BASE_PYTHON" -V 2>&1)." \
            "Set SLIMRL_BASE_PYTHON=/path/to/python3.11 (or newer)." >&2
        return 1
    fi
}

make_venv() {  # make_venv DIR: a fresh environment with pip, or a message naming what the base Python lacks
    check_base_python || return 1
    if ! "$BASE_PYTHON" -m venv "$1"; then
        rm -rf "$1"
        echo "slimrl: '$BASE_PYTHON -m venv $1' failed. On Debian/Ubuntu install the venv module first:" \
            "sudo apt install python3-venv (or python3.11-venv)." >&2
        return 1
    fi
}

pip_install() {  # pip_install PYTHON ARGS...: `pip install -q`, without pip's note on each configured index folder
    local python="$1"  # that does not exist on this machine ("WARNING: Location '...' is ignored")
    shift
    "$python" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
}

site_packages() {  # site_packages PYTHON: that interpreter's purelib folder
    "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

layered_venv() {  # layered_venv DIR: an environment on top of $PY's (its packages visible, its own first)
    if [ ! -x "$1/bin/python" ]; then
        make_venv "$1" || return 1
    fi
    local base_site layers
    base_site="$(cd "$(site_packages "$PY")" && pwd)"
    layers="$base_site/_slimrl_project_venv.pth"  # $PY's own layers, when it is itself a layered environment
    { echo "$base_site"; if [ -f "$layers" ]; then cat "$layers"; fi; } > "$(site_packages "$1/bin/python")/_slimrl_project_venv.pth"
}

project_venv() {  # sets VENV and PY, creating the environment when it is missing
    VENV="${SLIMRL_VENV:-.venv}"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "slimrl: creating the virtual environment $VENV (from $BASE_PYTHON)" >&2
        make_venv "$VENV" || return 1
    fi
    PY="$VENV/bin/python"
}
