"""A rank started by `distenv run` in tests: reports what it got, then behaves as told.

Plain Python (no torch), so that starting a few costs little. Usage::

    rank_child.py DIR [--fail-rank R --fail-mode exit3|segv|kill|raise] [--sleep S]
                      [--grandchild] [--escape [--escape-for S] [--escape-ignore-term]
                      [--end-escapee]]
                      [--on-signal] [--ignore-term] [--say] [ARGS...]

It writes DIR/rank<R>.json (its environment contract, argv and detected launcher) and DIR/pid<R>,
then, with --grandchild, starts a sleeping grandchild and writes its pid to DIR/gpid<R>. With
--escape, it first daemonizes a sleeper as a daemon does (fork, setsid, fork; the middle process
exits), which writes its own pid to DIR/epid<R> once it runs: an orphan outside the rank's process
group and session, with ESCAPEE in its argv. With --end-escapee, the failing rank SIGKILLs its
escaped sleeper and waits until it is a zombie (the launcher's to reap) before failing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "DISTENV_SCOPE",
    "TORCHELASTIC_USE_AGENT_STORE",
)

ESCAPEE = "distenv-test-escapee"
# Run by the escaped sleeper: python -c SLEEPER SECONDS ignore|term PIDFILE ESCAPEE.
SLEEPER = """
import os, signal, sys, time
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp = sys.argv[3] + ".tmp"
with open(tmp, "w") as file:
    file.write(str(os.getpid()))
os.replace(tmp, sys.argv[3])
time.sleep(float(sys.argv[1]))
"""


def write(path: Path, text: str) -> None:
    """Write atomically, so the test never reads half a file."""
    tmp = path.with_name(f".{path.name}.tmp")  # a name the tests' globs never match
    tmp.write_text(text)
    tmp.replace(path)


def escape(pidfile: Path, seconds: float, ignore_term: bool) -> None:
    """Daemonize a sleeper (fork, setsid, fork) and wait until it has written `pidfile`."""
    middle = os.fork()
    if middle == 0:
        try:
            os.setsid()
            on_term = "ignore" if ignore_term else "term"
            subprocess.Popen(
                [sys.executable, "-S", "-c", SLEEPER, str(seconds), on_term, str(pidfile), ESCAPEE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    deadline = time.monotonic() + 20
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def end(pid: int) -> None:
    """SIGKILL `pid` (not a child of ours) and wait until it is a zombie or gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat[stat.rindex(")") + 2] in "ZX":
            return
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-mode", default="exit3")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--escape", action="store_true")
    parser.add_argument("--escape-for", type=float, default=60.0)
    parser.add_argument("--escape-ignore-term", action="store_true")
    parser.add_argument("--end-escapee", action="store_true")
    parser.add_argument("--on-signal", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--say", action="store_true")
    known, _ = parser.parse_known_args()
    out: Path = known.dir
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])

    def marker(signum: int, frame: object) -> None:
        write(out / f"{signal.Signals(signum).name}{rank}", "")
        sys.exit(0)

    if known.on_signal:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, marker)
    if known.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    from distenv.detection.pipeline import detect

    report = {name: os.environ.get(name) for name in CONTRACT}
    report.update(argv=sys.argv[1:], detected=detect().launcher)
    write(out / f"rank{rank}.json", json.dumps(report))
    if known.escape:
        escape(out / f"epid{rank}", known.escape_for, known.escape_ignore_term)
    if known.grandchild:
        # Inherits nothing it could keep the launcher's pipes open with.
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        write(out / f"gpid{rank}", str(grandchild.pid))
    write(out / f"pid{rank}", str(os.getpid()))
    if known.say:
        print(f"hello from {rank}")
        print(f"complaint from {rank}", file=sys.stderr)

    if rank == known.fail_rank:
        # Fail only once every rank runs, so that there is someone to stop.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all((out / f"pid{r}").exists() for r in range(world)):
                break
            time.sleep(0.02)
        if known.end_escapee:
            end(int((out / f"epid{rank}").read_text()))
        mode = known.fail_mode
        if mode == "exit3":
            sys.exit(3)
        if mode in ("segv", "kill"):
            os.kill(os.getpid(), signal.SIGSEGV if mode == "segv" else signal.SIGKILL)
        raise RuntimeError("rank_child failing on purpose")
    time.sleep(known.sleep)


if __name__ == "__main__":
    main()
