#!/usr/bin/env bash
# Run every benchmark and regenerate docs/benchmarks.md (+ plots and raw JSON in docs/benchmarks/)
# from its template, docs/benchmarks.md.in. The lab-only tools in benchmarks/lab/ are run by hand.
#
#   bash benchmarks/run.sh            # the full run (~20 min on a 2-core machine)
#   bash benchmarks/run.sh --quick    # fewer repetitions, to try changes (do not publish)
#
# Competitors (mmengine, lightning-fabric, submitit) and matplotlib live in their own venv,
# .venv-bench, created here if missing, so they never enter the test venv. The srun benchmarks
# need the test Slurm cluster "one": tests/harness/setup.sh starts it (idempotent) when absent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv-bench
STATE=${DISTENV_TEST_STATE:-/var/tmp/distenv-test}
if [[ ! -x $VENV/bin/python ]] || ! $VENV/bin/python -c "import mmengine, matplotlib, distenv" 2>/dev/null; then
    python3 -m venv "$VENV"
    # Exactly this torch spec: a CPU wheel is on disk; any other spec downloads GBs of CUDA.
    # torch is pinned on the same line so that no competitor's requirement upgrades it.
    "$VENV/bin/pip" install --quiet torch==2.13.0
    "$VENV/bin/pip" install --quiet torch==2.13.0 mmengine lightning-fabric submitit matplotlib \
        numpy python-hostlist -e .
fi
if ! grep -q DISTENV_TEST_SLURM_ONE "$STATE/env.sh" 2>/dev/null \
        || ! SLURM_CONF=$(sed -n 's/^export DISTENV_TEST_SLURM_ONE=//p' "$STATE/env.sh") \
            timeout 60 srun -n 1 true 2>/dev/null; then
    bash tests/harness/setup.sh
fi
# The ranks import distenv's modules from the checkout (an editable install): compiled here, so
# that no launch compiles them where PYTHONDONTWRITEBYTECODE is set (tests/harness/setup.sh).
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q -j 0 distenv benchmarks >/dev/null
exec "$VENV/bin/python" benchmarks/run_all.py "$@"
