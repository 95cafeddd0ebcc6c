#!/usr/bin/env bash
# The versions tier: the default tier's tests on each end of slimrl/versions.py's ranges of transformers and TRL.
#   low:  the lowest release inside SUPPORTED's range (its floor), in .venv-versions-low
#   high: the newest release inside the range on the package index (pip index versions), in .venv-versions-high
# The ends are slimrl.versions.range_ends() of the index's releases: the ranges are read, never copied here. Each
# environment is layered on the project's .venv (scripts/venv.sh: layered_venv) and shadows only transformers and TRL
# (and what their pins need). Each end writes bench/results/versions_tier_END.json: the pytest summary and the
# library versions the tests ran on. Extra arguments go to pytest, e.g. `-k parity tests/patches tests/ops`;
# SLIMRL_VERSIONS_ENDS=low runs one end. Exit status 1 when an end failed (both still run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
source scripts/venv.sh
project_venv
PACKAGES=(transformers trl)

range_end() {  # range_end PACKAGE low|high: that end of PACKAGE's range among the index's releases
    local releases
    releases="$("$PY" -m pip index versions "$1" 2>/dev/null | sed -n 's/^Available versions: //p')"
    "$PY" -c 'import sys; from slimrl.versions import range_ends
print(range_ends(sys.argv[1], sys.argv[2].split(", "))[sys.argv[3] == "high"])' "$1" "$releases" "$2"
}

export HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
failed=0
for end in ${SLIMRL_VERSIONS_ENDS:-low high}; do
    venv=".venv-versions-$end"
    pins=()
    for package in "${PACKAGES[@]}"; do pins+=("$package==$(range_end "$package" "$end")"); done
    echo "=== versions tier, $end end: ${pins[*]} ($venv) ===" >&2
    layered_venv "$venv"
    pip_install "$venv/bin/python" "${pins[@]}"
    pip_install "$venv/bin/python" --no-deps -e .
    log="$(mktemp)"
    start=$(date +%s)
    if HF_HUB_OFFLINE=1 "$venv/bin/python" -m pytest -q -ra "$@" 2>&1 | tee "$log"; then
        outcome=passed
    else
        outcome=FAILED
        failed=1
    fi
    "$venv/bin/python" - "$end" "$outcome" "$(( $(date +%s) - start ))" "$log" "$@" <<'PYEOF'
import sys

sys.path.insert(0, "bench")
import _common

end, outcome, wall, log, *args = sys.argv[1:]
sys.argv = ["scripts/test_versions.sh", *args]  # the command the provenance names
summary = [line for line in open(log).read().splitlines() if line.strip()][-1].strip("= ")
path = _common.results_path(f"versions_tier_{end}")
failures = [line for line in open(log).read().splitlines() if line.startswith(("FAILED ", "ERROR "))]
data = {"end": end, "outcome": outcome, "pytest_args": args, "summary": summary, "wall_seconds": int(wall)}
data["failures"] = failures  # pytest's -ra lines: each failed or erroring test and the start of its message
print("wrote", _common.write_results(path, data), file=sys.stderr)
PYEOF
    rm -f "$log"
done
exit "$failed"
