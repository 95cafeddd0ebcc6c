#!/usr/bin/env bash
# The test command, the one CI runs (.ci/run: ruff, then this): the tiers of TIERS, one after the other,
# each installing what it needs into its own virtual environment first, then a table of each tier's outcome, wall
# time and CPU time. Exit status 1 when any tier failed (every tier still runs).
#   bash scripts/test.sh                    every tier of TIERS (what CI runs: default, slow, mkl_paths, distributed, vllm, notebooks)
#   bash scripts/test.sh default vllm       those tiers, in that order
#   bash scripts/test.sh -x tests/ops       the default tier alone with these pytest arguments (the first argument is
#                                           not a tier name), e.g. `bash scripts/test.sh -m slow` for the slow tier's tests
# TIERS is the one list of what CI runs: NAME runs `bash scripts/test_NAME.sh`. Every scripts/test_NAME.sh is in TIERS
# or in NOT_IN_CI (tests/test_tiers.py checks it), so a new tier script is never left out unnoticed.
# Tiers run here are strict (SLIMRL_CI=1, tests/_ci_mode.py): a test skipped because a package is not installed fails,
# and a tier whose install fails fails; nothing is skipped for a missing install.
set -euo pipefail
cd "$(dirname "$0")/.."

TIERS=(default slow mkl_paths distributed vllm notebooks)
# The other tiers run by name (`bash scripts/test.sh nightly`); a CPU tier joins TIERS once it has been timed on a
# clean 2-core clone within CI's budget (docs/testing.md, "Time").
NOT_IN_CI=(nightly gpu versions)  # nightly: learning runs of 10 minutes to an hour or more each on 2 cores, run on a schedule; gpu: needs a CUDA GPU (docs/gpu-and-benchmarks.md); versions: the default tier twice more, on the lowest and the highest transformers and TRL in their own environments, which would take CI past its budget

is_tier() {
    local name
    for name in "${TIERS[@]}" "${NOT_IN_CI[@]}"; do
        [ "$name" = "$1" ] && return 0
    done
    return 1
}

if [ $# -gt 0 ] && ! is_tier "$1"; then
    exec bash scripts/test_default.sh "$@"
fi
if [ $# -eq 0 ]; then selected=("${TIERS[@]}"); else selected=("$@"); fi
for tier in "${selected[@]}"; do
    is_tier "$tier" || { echo "unknown tier '$tier': one of ${TIERS[*]} ${NOT_IN_CI[*]}" >&2; exit 2; }
done
export SLIMRL_CI="${SLIMRL_CI:-1}"
# each tier's log names its 25 slowest tests, so the time each tier takes (the table at the end) can be traced
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:---durations=25}"

cpu_of_children() {  # CPU_SECONDS = the CPU seconds (user + system) of every finished child of this shell so far
    local out  # (not in a $(...) subshell: its `times` would count only the subshell's own children)
    out="$(mktemp)"
    times > "$out"
    CPU_SECONDS=$(sed -n 2p "$out" | tr -d 's' | awk '{split($1, u, "m"); split($2, s, "m"); printf "%.0f", u[1]*60 + u[2] + s[1]*60 + s[2]}')
    rm -f "$out"
}

summary=()
failed=0
for tier in "${selected[@]}"; do
    echo "=== tier $tier: bash scripts/test_$tier.sh ===" >&2
    start=$(date +%s)
    cpu_of_children
    cpu_before=$CPU_SECONDS
    if bash "scripts/test_$tier.sh"; then outcome=passed; else outcome=FAILED; failed=1; fi
    wall=$(( $(date +%s) - start ))
    cpu_of_children
    cpu=$(( CPU_SECONDS - cpu_before ))
    summary+=("$(printf '%-12s %-7s %4d min %02d s wall   %5d s CPU' "$tier" "$outcome" $((wall / 60)) $((wall % 60)) "$cpu")")
done
echo "=== tiers ($(nproc) cores) ===" >&2
printf '%s\n' "${summary[@]}" >&2
exit "$failed"
