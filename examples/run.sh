#!/usr/bin/env bash
# The main job: a real 4-process DDP training run on this machine, started by distenv's local
# launcher (`distenv run`). Creates .venv first with only what the job needs (torch==2.13.0,
# python-hostlist, numpy and distenv itself: tests/harness/setup.sh --venv-only); tests/run.sh
# installs the rest (test, lint and docs tools, the recipes' frameworks) into the same venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
T0=$SECONDS
bash tests/harness/setup.sh --venv-only
printf '[run %3ds] distenv run --nproc-per-node %s examples/train.py --launcher auto %s\n' \
    "$((SECONDS - T0))" "${NPROC:-4}" "$*"
exec .venv/bin/distenv run --nproc-per-node "${NPROC:-4}" examples/train.py --launcher auto "$@"
