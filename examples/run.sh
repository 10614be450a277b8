#!/usr/bin/env bash
# The main job: a real 4-process DDP training run on this machine, started by distenv's local
# launcher (`distenv run`). Creates the venv first (tests/harness/setup.sh --venv-only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/harness/setup.sh --venv-only
exec .venv/bin/distenv run --nproc-per-node "${NPROC:-4}" examples/train.py --launcher auto "$@"
