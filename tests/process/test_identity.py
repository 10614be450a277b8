"""Bootstrap identity with real processes: a retried init_dist, any host name, two jobs of one identity.

Issue #44 items 2, 7 and 8: rank 0 retries `init_dist` in the process whose first attempt failed
(the failed store is let go at once, so the retry listens on the port again); host names with a
space or a non-ASCII letter, set in a UTS namespace; two jobs that cannot be told apart on one
port fail on every rank, naming the collision, and never all-reduce together.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from urllib.parse import unquote

from tests.process.test_rollcall_processes import finish
from tests.support.spawn import REPO, contract_env, free_port

SCRIPTS = REPO / "tests" / "support" / "scripts"


def _rank(script: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *args],
        env={**env, "PYTHONFAULTHANDLER": "1"},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_init_dist_retried_in_process_listens_again() -> None:
    """Rank 0's first init_dist fails (rank 1 absent, 2 s); its retry, from inside the except
    clause, listens on the same port and finishes an all_reduce with rank 1."""
    port = free_port()
    first = _rank("retry_rank.py", contract_env(0, 2, port), "--first", "2")
    assert first.stdout is not None
    line, deadline = "", time.monotonic() + 120
    while not line.startswith("FIRST"):
        assert time.monotonic() < deadline, "rank 0's first attempt never ended"
        line = first.stdout.readline()
        if not line and first.poll() is not None:
            break
    assert line == "FIRST RendezvousTimeoutError\n", line
    second = _rank("retry_rank.py", contract_env(1, 2, port))
    results = finish([first, second], 120)
    for rank, (code, out) in enumerate(results):
        assert code == 0, out
        assert f"SUM {rank} 2" in out, out
        assert "cannot listen" not in out, out


# Runs the rest of its arguments as a Python program in a new UTS namespace (made by `unshare`),
# after setting the host name there to argv[1]: `socket.sethostname` as root.
NAMED = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)
# As root, a UTS namespace needs nothing else; otherwise a user namespace maps this user to root.
UNSHARE = ["unshare", "--uts"] if os.geteuid() == 0 else ["unshare", "--user", "-r", "--uts"]


def test_host_names_with_a_space_or_a_non_ascii_letter_train() -> None:
    """Two 2-rank jobs whose host is named 'my node' and 'nœud' (each rank in a UTS namespace)
    pass init_dist and all_reduce; a rank's record names its host in the escaped form."""
    names = ("my node", "nœud")
    procs = []
    for name in names:
        port = free_port()
        for rank in range(2):
            env = contract_env(rank, 2, port, extra={"DISTENV_TIMEOUT": "60"})
            procs.append(
                subprocess.Popen(
                    [*UNSHARE, sys.executable, "-c", NAMED, name, str(SCRIPTS / "host_rank.py")],
                    env={**env, "PYTHONFAULTHANDLER": "1"},
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
    results = finish(procs, 180)
    for index, (code, out) in enumerate(results):
        name, rank = names[index // 2], index % 2
        assert code == 0, out
        assert f"SUM {rank} 2" in out, out
        recorded = out.split(f"HOST {rank} ", 1)[1].split()[0]
        assert recorded != name, out
        assert unquote(recorded) == name, out
