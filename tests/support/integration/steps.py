#!/usr/bin/env python3
"""Run commands one after another and report each as one JSON line (no shell involved).

Used as the command of ``salloc``, so that several job steps (or mpirun launches) share one
allocation without a shell script:

    salloc -N 2 python steps.py CMD [ARG...] ::: CMD [ARG...] ::: ...

Each command runs to completion (bounded by --timeout) with its output captured; then one line
``{"step": i, "argv": [...], "returncode": n, "stdout": "...", "stderr": "..."}`` is printed.
Every command runs, whatever the previous ones returned; the exit status is 0 unless a command
timed out (the tests judge the return codes).
"""

from __future__ import annotations

import json
import subprocess
import sys

SEP = ":::"


def split(argv: list[str]) -> list[list[str]]:
    """Split ``A a ::: B b`` into ``[[A, a], [B, b]]``."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == SEP:
            groups.append([])
        else:
            groups[-1].append(arg)
    return [g for g in groups if g]


def main(argv: list[str] | None = None) -> int:
    """Run the commands in order and print one JSON line per command."""
    args = sys.argv[1:] if argv is None else argv
    timeout = 100.0
    if args[:1] == ["--timeout"]:
        timeout, args = float(args[1]), args[2:]
    status = 0
    for i, cmd in enumerate(split(args)):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, status = -1, 1
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            err = f"steps.py: timed out after {timeout}s"
        line = {"step": i, "argv": cmd, "returncode": code, "stdout": out, "stderr": err}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
