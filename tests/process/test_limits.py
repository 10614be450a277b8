"""Rank 0 raises its soft descriptor limit for a large world, or refuses at once (#28 item 3).

Real processes with lowered limits: rank 0 of a 1 024-rank world (the others never start) hosts
the store, counts what it will hold and raises its soft RLIMIT_NOFILE before the store, or, with
a hard limit below the need, refuses before anything waits.
"""

from __future__ import annotations

import json
import subprocess
import sys

from distenv.bootstrap.limits import RESERVE, needed
from distenv.bootstrap.probe import WINDOW
from distenv.master import free_port
from distenv.rankinfo import RankInfo
from tests.support.spawn import REPO, contract_env

WORLD = 1024

RANK0 = """
import json, resource, sys, time
soft, hard = (int(v) for v in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
import distenv, torch  # torch first: the bound below is for the bootstrap, not the import
from distenv.errors import DistEnvError
began = time.monotonic()
try:
    distenv.init_dist(backend="gloo")
except DistEnvError as error:
    print(json.dumps({"error": type(error).__name__, "text": str(error),
                      "seconds": time.monotonic() - began,
                      "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


def _info(rank: int, world: int) -> RankInfo:
    return RankInfo(
        rank=rank, world_size=world, local_rank=rank, local_world_size=world, node_rank=0,
        num_nodes=1, master_addr=None, master_port=None, launcher="pytorch",
    )  # fmt: skip


def _rank0(soft: int, hard: int, timeout: str = "3") -> dict[str, object]:
    env = contract_env(0, WORLD, free_port(), extra={"DISTENV_TIMEOUT": timeout})
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", RANK0, str(soft), str(hard)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    result: dict[str, object] = json.loads(line)
    return result


def test_rank_0_raises_its_soft_limit_for_the_store_and_the_mesh() -> None:
    """Soft 256, hard 8192: the store (1024) and gloo's mesh (1023) need more; rank 0 raises its
    soft limit before the store and then waits for the others as usual (who never come)."""
    result = _rank0(256, 8192)
    assert result["error"] == "RendezvousTimeoutError", result
    assert isinstance(result["soft"], int)
    assert WORLD + (WORLD - 1) + RESERVE <= result["soft"] <= 8192, result


def test_a_hard_limit_below_the_need_is_refused_at_once_naming_it() -> None:
    result = _rank0(512, 512, timeout="60")
    assert result["error"] == "ConfigurationError", result
    text = str(result["text"])
    assert "rank 0 of 1024 needs about" in text, text
    assert "its hard limit (RLIMIT_NOFILE, `ulimit -Hn`) is 512" in text, text
    assert "1024 for the store's connections, 1023 for gloo's connections" in text, text
    assert "Hint: raise the hard limit of open files to at least" in text, text
    assert isinstance(result["seconds"], float)
    assert result["seconds"] < 5, result  # not the 60 s rendezvous timeout
    assert result["soft"] == 512


def test_a_small_job_keeps_its_limits() -> None:
    """Four ranks fit any usual limit: nothing is raised (and /proc is not even listed)."""
    info = _info(0, 4)
    need = needed(info, "gloo", hosts_store=True, probes=False, open_now=0)
    assert need.total == 4 + 3 + RESERVE < 1024
    assert _rank0_small() == "unchanged"


def _rank0_small() -> str:
    code = (
        "import resource, distenv\n"
        "from distenv.bootstrap.limits import ensure_descriptors\n"
        "from distenv.rankinfo import RankInfo\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))\n"
        "info = RankInfo(rank=0, world_size=4, local_rank=0, local_world_size=4, node_rank=0,"
        " num_nodes=1, master_addr=None, master_port=None, launcher='pytorch')\n"
        "ensure_descriptors(info, 'gloo', hosts_store=True, probes=True)\n"
        "print('unchanged' if resource.getrlimit(resource.RLIMIT_NOFILE) == (1024, 4096)"
        " else resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(REPO)}, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_what_each_rank_counts() -> None:
    """Rank 0 hosting the store counts it; a gloo mesh counts every other rank on every rank;
    nccl builds no mesh of sockets; rank 0's probes count where it probes."""
    rank0, rank5 = _info(0, 16), _info(5, 16)
    assert needed(rank0, "gloo", hosts_store=True, probes=True, open_now=10)[1:] == (
        16,
        15,
        WINDOW,
        0,
    )
    assert needed(rank0, "nccl", hosts_store=False, probes=False, open_now=10)[1:] == (0, 0, 0, 0)
    assert needed(rank5, "cpu:gloo,cuda:nccl", hosts_store=False, probes=False, open_now=3)[1:] == (
        0,
        15,
        0,
        0,
    )
    # A node's leader holds a connection from each of its node's other ranks.
    assert needed(rank0, "nccl", hosts_store=True, probes=False, open_now=0, members=7).members == 7
