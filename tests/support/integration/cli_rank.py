#!/usr/bin/env python3
"""One rank of a launch that runs several `distenv` commands in one process, and reports them.

    python tests/support/integration/cli_rank.py info :: info --json :: export --mpi

Each `::`-separated group of arguments (not `:::`, which steps.py takes) is handed to
``distenv.cli.main`` (what ``python -m distenv`` runs), one after another in this process, with its
stdout and stderr captured at the file descriptors (`distenv doctor` writes to the ``sys.stdout``
of its import); then ONE JSON line
``{"cli_rank": 1, "hostname": ..., "runs": [{"argv", "status", "stdout", "stderr"}, ...]}`` is
written in a single ``os.write`` (Hydra interleaves ranks' output mid-line otherwise). One
process for several commands keeps the launches few: `export --mpi` is collective, so every rank
runs the same commands in the same order.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

MARKER = "cli_rank"
SEP = "::"


def main(argv: list[str] | None = None) -> int:
    """Run each `::`-separated distenv command and print one JSON line; exit 0."""
    from distenv.cli import main as distenv_main

    args = sys.argv[1:] if argv is None else argv
    groups: list[list[str]] = [[]]
    for arg in args:
        groups.append([]) if arg == SEP else groups[-1].append(arg)
    saved = os.dup(1), os.dup(2)
    runs = []
    for command in (g for g in groups if g):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                status = distenv_main(command)
            except SystemExit as exc:  # argparse's usage errors
                status = exc.code if isinstance(exc.code, int) else 2
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            texts = []
            for captured in (out, err):
                captured.seek(0)
                texts.append(captured.read().decode(errors="replace"))
        runs.append({"argv": command, "status": status, "stdout": texts[0], "stderr": texts[1]})
    record = {MARKER: 1, "hostname": socket.gethostname(), "runs": runs}
    os.write(1, (json.dumps(record) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
