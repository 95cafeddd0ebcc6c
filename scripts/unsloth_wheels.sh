#!/usr/bin/env bash
# Downloads, here (where pip reaches an index), what the Unsloth arm of bench/gpu_memory.py needs on a GPU machine
# with no network, into .whl/unsloth/ (git-ignored, carried with .whl/): Unsloth 2026.10.9 and its zoo, the TRL and
# datasets it pins (trl 1.15.0, datasets 4.8.5), and pillow (unsloth_zoo imports PIL when Unsloth is imported; a GPU
# image without torchvision may lack it). scripts/gpu_bench.sh installs them with --no-deps into a folder of their
# own (UNSLOTH_SITE), which only the Unsloth arm's process puts on its path.
#
# The unsloth wheel is 28 MiB, most of it its web app (studio/) and command line (unsloth_cli/), which the library
# never imports: a copy without them (its RECORD updated) is written instead, about 3 MiB. The total of .whl/ (the
# GPU tier's wheels included) is checked against WHEEL_BUDGET_MIB (default 60), so the checkout carried to a GPU
# machine without a network stays small; raise it where a larger copy is no problem.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.8.5 pillow==13.0.0)
BUDGET_MIB="${WHEEL_BUDGET_MIB:-60}"
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done

git check-ignore -q .whl/probe.whl || { echo "/.whl/ must be git-ignored (add it to .gitignore)" >&2; exit 1; }
mkdir -p .whl/unsloth
rm -f .whl/unsloth/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl/unsloth "${WHEELS[@]}"

python3 - .whl/unsloth <<'EOF'
"""Rewrite the unsloth wheel without studio/ and unsloth_cli/ (and their RECORD lines)."""
import glob
import os
import sys
import zipfile

DROP = ("studio/", "unsloth_cli/")
(path,) = glob.glob(os.path.join(sys.argv[1], "unsloth-*.whl"))
slim = path + ".slim"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if info.filename.startswith(DROP):
            continue
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not line.startswith(DROP)).encode()
        dst.writestr(info, data)
os.replace(slim, path)
print(f"{os.path.basename(path)}: {os.path.getsize(path) / 2**20:.1f} MiB without {', '.join(DROP)}")
EOF

count=$(find .whl/unsloth -maxdepth 1 -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
    echo "expected ${#WHEELS[@]} wheels in .whl/unsloth/, found $count" >&2
    exit 1
fi
ls -l .whl/unsloth/*.whl
total=$(find .whl -type f -printf '%s\n' | awk '{s += $1} END {print s}')
mib=$(( (total + 1048575) / 1048576 ))
echo "total of .whl/: ${mib} MiB (budget ${BUDGET_MIB} MiB)"
if [ "$mib" -gt "$BUDGET_MIB" ]; then
    echo "the wheels exceed the budget: raise WHEEL_BUDGET_MIB if a larger copy to the GPU machine is fine" >&2
    exit 1
fi
