"""The release of a group the backend proved, under `distenv run` (real processes, gloo).

Where the backend's init proves the group (NCCL with ``device_id=``, `distenv.bootstrap.proof`),
the group-up round trip is skipped and rank 0 releases the group with one write. No GPU here:
tests/support/scripts/proven_rank.py takes gloo's init as proof, so that the release path runs
under a real launcher, flat and through node leaders, and its fault (rank 0 stopped after its init
returned) is named within the bound. The collision guard's release: tests/unit/test_release.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.process.test_run import gone, launcher_env
from tests.support.spawn import REPO

PROVEN = str(REPO / "tests" / "support" / "scripts" / "proven_rank.py")
TIMEOUT_S = 8.0
# Interpreter start and `import torch` of 4 ranks on 2 loaded cores, before init_dist.
START_SLACK_S = 60.0
# A rank's message after its deadline: the interpreter's and torch's teardown aside.
EXIT_SLACK_S = 10.0


def _run(**extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = launcher_env(DISTENV_TIMEOUT=f"{TIMEOUT_S:g}", PYTHONUNBUFFERED="1", **extra)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "4", PROVEN],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 10 + START_SLACK_S + 60,
        check=False,
    )
    return result, time.monotonic() - start


@pytest.mark.parametrize("leaders", ["off", "on"])
def test_a_released_group_all_reduces_on_every_rank(leaders: str) -> None:
    """Every rank passes init_dist through rank 0's release (no group-up check), flat or through
    its node's leader, and all-reduces 4."""
    result, _ = _run(DISTENV_NODE_LEADERS=leaders)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for rank in range(4):
        assert re.search(rf"SUM {rank} 4\b", out), out
    assert out.count("PATH release") == 4, out
    assert "PATH groupup" not in out, out


def test_rank_0_stopped_before_its_release_is_named_within_the_bound(tmp_path: Path) -> None:
    """Rank 0 SIGSTOPped once its init returned, before it releases (its store frozen with it):
    the first rank to fail names rank 0 within the bound, whether it waits for the release or, as
    gloo's connect lets it, still in init_process_group; none all-reduces. The test SIGKILLs rank
    0 once a rank has failed, as a stopped rank outlives any launcher's stop."""
    out = tmp_path / "out.txt"
    env = launcher_env(
        DISTENV_TIMEOUT=f"{TIMEOUT_S:g}",
        PYTHONUNBUFFERED="1",
        PROVEN_FAULT="stop-rank0-before-release",
        DISTENV_NODE_LEADERS="off",
    )
    with out.open("w") as sink:
        launch = subprocess.Popen(
            [sys.executable, "-m", "distenv", "run", "-n", "4", PROVEN],
            env=env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        until = time.monotonic() + START_SLACK_S + TIMEOUT_S + 10 + EXIT_SLACK_S
        stopped = error = None
        while time.monotonic() < until and error is None:
            text = out.read_text()
            stopped = stopped or re.search(r"STOPPING (\d+)", text)
            error = re.search(r"ERROR \w+: .*", text)
            time.sleep(0.1)
        assert stopped is not None, out.read_text()
        assert error is not None, out.read_text()  # within the bound: before `until`
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stopped.group(1)), signal.SIGKILL)
        code = launch.wait(timeout=120)
    text = out.read_text()
    first = error.group(0)
    assert re.search(
        r"rank 0 did not release the process group|rank 0's store does not answer either "
        r"\(rank 0 stopped",
        first,
    ), text
    assert "SUM" not in text, text
    assert code not in (0, None), text
    assert gone(int(stopped.group(1))), text
