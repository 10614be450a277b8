#!/usr/bin/env bash
# Run every test of distenv on a fresh Debian machine, as root: this script does all the set-up
# (apt packages, the venv, munge, two Slurm clusters) through tests/harness/setup.sh, then lint,
# types and the whole pytest suite, real launchers included. GPU tests are deselected here; run
# them on a GPU machine with: .venv/bin/pytest -m gpu
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$SECONDS
bash tests/harness/setup.sh
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== lint-imports (layering: pyproject.toml [tool.importlinter])"
.venv/bin/lint-imports --no-cache
echo "== mypy --strict distenv/"
.venv/bin/mypy
if [[ -f mkdocs.yml ]]; then
    echo "== mkdocs build --strict"
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
fi
echo "== pytest"
# DISTENV_STRICT_TESTS makes any skipped or xfailed test fail the run (tests/conftest.py); the 25
# slowest tests are listed at the end, to keep the run under its 20-minute target.
DISTENV_STRICT_TESTS=1 .venv/bin/pytest --all -m "not gpu" -p no:cacheprovider --durations=25 "$@"
echo "== all tests passed in $((SECONDS - start)) s"
