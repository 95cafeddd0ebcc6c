#!/usr/bin/env bash
# The GPU tier, then the GPU benchmark (bench/gpu_memory.py), in one command on a CUDA machine with no network.
#
#   bash scripts/gpu_bench.sh --prepare                              # here, where pip works: the wheels into .whl/
#   bash scripts/gpu_bench.sh --preset quick --out DIR [--budget S]  # on the GPU machine, with .whl/ copied over
#   bash scripts/gpu_bench.sh --preset full --out DIR --budget 3600 -- --only grpo bisect   # extra bench flags
#   bash scripts/gpu_bench.sh --preset speed --out DIR               # the speed arms and kernel profiles, < 9 min
#   bash scripts/gpu_bench.sh --preset longest --out DIR             # the longest-completion search, < 9 min
#
# Presets (bench/gpu_memory.py's): quick, full, speed (every speed arm at 8B-class then 1.5B, 8 x 8192, 1 warm-up +
#   4 timed steps, three arms profiled; the lever-by-lever arms last), longest (slimrl, stock-ga8 and Unsloth's
#   longest 8-row completion from slimrl's predicted length, then slimrl's 1-row probe at 262144). speed and longest
#   skip the GPU tier (all their time goes to the bench); --tier runs it anyway.
#
# --prepare: scripts/gpu_wheels.sh (the tier's wheels), scripts/unsloth_wheels.sh (the Unsloth arm's), and
#   .whl/source.json (the commit they were prepared from, for machines that get the files without .git).
# Otherwise, in order, all inside --budget seconds (default 570):
#   1. scripts/gpu_env.sh: the carried wheels ($WHEEL_DIR, default .whl) installed offline into $GPU_SITE, src/ on
#      PYTHONPATH; $WHEEL_DIR/unsloth/ installed the same way into $UNSLOTH_SITE (default /tmp/unsloth-site), for the
#      Unsloth arm only.
#   2. the GPU tier (scripts/test_gpu.sh), at most --tier-seconds (default 240); its log, JSON lines and exit status go
#      to DIR; a failing tier is reported and the bench still runs (--skip-tier: no tier).
#   3. bench/gpu_memory.py --preset P --out DIR/bench --deadline <what is left>, plus any flags after `--`.
# Exit status: the bench's, or 3 when the tier failed and the bench passed.
set -euo pipefail
cd "$(dirname "$0")/.."

preset=quick out="" budget=570 tier_seconds=240 skip_tier="" prepare=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) prepare=1 ;;
        --preset) preset="$2"; shift ;;
        --out) out="$2"; shift ;;
        --budget) budget="$2"; shift ;;
        --tier-seconds) tier_seconds="$2"; shift ;;
        --skip-tier) skip_tier=1 ;;
        --tier) skip_tier=0 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$preset" in
    quick|full) skip_tier="${skip_tier:-0}" ;;
    speed|longest) skip_tier="${skip_tier:-1}" ;;
    *) echo "--preset must be quick, full, speed or longest, not '$preset'" >&2; exit 2 ;;
esac
[[ "$budget" =~ ^[0-9]+$ && "$tier_seconds" =~ ^[0-9]+$ ]] || { echo "--budget and --tier-seconds take seconds" >&2; exit 2; }

if [ "$prepare" = 1 ]; then
    bash scripts/gpu_wheels.sh
    bash scripts/unsloth_wheels.sh
    python3 -c 'import json, subprocess, sys
run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
json.dump({"commit": run("rev-parse", "HEAD"), "dirty": bool(run("status", "--porcelain"))}, open(sys.argv[1], "w"))' \
        .whl/source.json
    echo "prepared: .whl/ ($(du -sh .whl | cut -f1)), commit $(cat .whl/source.json)"
    exit 0
fi
[ -n "$out" ] || { echo "--out DIR is required (where the results go)" >&2; exit 2; }
started=$SECONDS
mkdir -p "$out"

source scripts/gpu_env.sh
WHEEL_DIR="${WHEEL_DIR:-.whl}"
if [ -z "${SLIMRL_COMMIT:-}" ] && [ -f "$WHEEL_DIR/source.json" ]; then
    SLIMRL_COMMIT=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"])' "$WHEEL_DIR/source.json")
    export SLIMRL_COMMIT
fi
if compgen -G "$WHEEL_DIR/unsloth/*.whl" > /dev/null; then
    export UNSLOTH_SITE="${UNSLOTH_SITE:-/tmp/unsloth-site}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$UNSLOTH_SITE" \
        "$WHEEL_DIR"/unsloth/*.whl
fi

tier_status=0
if [ "$skip_tier" = 0 ]; then
    set +e
    SLIMRL_GPU_REPORT="$out/gpu_tier.jsonl" timeout "$tier_seconds" bash scripts/test_gpu.sh > "$out/gpu_tier.log" 2>&1
    tier_status=$?
    set -e
    echo "$tier_status" > "$out/gpu_tier.status"
    tail -n 5 "$out/gpu_tier.log"
    echo "GPU tier: exit status $tier_status (log: $out/gpu_tier.log)"
fi

left=$(( budget - (SECONDS - started) - 10 ))
if [ "$left" -lt 60 ]; then
    echo "no time left for the bench (${left} s of --budget ${budget})" >&2
    exit 1
fi
set +e
"$PYTHON" bench/gpu_memory.py --preset "$preset" --out "$out/bench" --deadline "$left" ${extra[@]+"${extra[@]}"} \
    2> >(tee "$out/bench.log" >&2)
bench_status=$?
set -e
if [ "$bench_status" = 0 ] && [ "$tier_status" != 0 ]; then
    exit 3
fi
exit "$bench_status"
