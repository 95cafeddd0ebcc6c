#!/usr/bin/env bash
# The nightly tier: the tests marked `nightly`, learning runs on the embedded SmolLM2-135M that take 10 minutes to an
# hour or more each on 2 cores (the bare `slimrl grpo --seed 1`; `slimrl grpo` then `slimrl gkd` distilling its adapter
# into a fresh student; `slimrl ppo --seed 1`). Too long for CI's budget: run on a schedule (e.g. a nightly cron) or
# before a release. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/test_default.sh -m nightly "$@"
