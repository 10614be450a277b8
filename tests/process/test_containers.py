"""`distenv info` names the container runtime; `distenv doctor` names a /dev/shm too small.

The small /dev/shm is real: doctor runs in its own mount namespace (``unshare --mount``, as root)
over a 64 MiB tmpfs, Docker's and podman's default.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import scrubbed_environ
from tests.support.integration.helpers import REPO


def _doctor_over_shm(size: str) -> subprocess.CompletedProcess[str]:
    """Run `distenv doctor` alone with /dev/shm a fresh tmpfs of `size`."""
    script = 'mount -t tmpfs -o size="$1" tmpfs /dev/shm && shift && exec "$@"'
    doctor = [sys.executable, "-m", "distenv", "doctor"]
    namespace = ["unshare", "--mount", "--propagation", "private"]
    return subprocess.run(
        [*namespace, "sh", "-c", script, "sh", size, *doctor],
        env={**scrubbed_environ(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_doctor_names_a_small_dev_shm_and_the_fix() -> None:
    """64 MiB: a warning naming the size and `--shm-size`/`--ipc=host`; 2 GiB: no warning."""
    small, large = _doctor_over_shm("64m"), _doctor_over_shm("2g")
    assert small.returncode == 0, small.stdout + small.stderr
    assert "warning: /dev/shm is 64 MiB" in small.stdout
    assert "`--shm-size=1g`" in small.stdout
    assert "`--ipc=host`" in small.stdout
    assert large.returncode == 0, large.stdout + large.stderr
    assert "/dev/shm" not in large.stdout
    assert "verdict: OK" in large.stdout


@pytest.mark.parametrize(
    ("env", "name", "row"),
    [
        ({"CH_RUNNING": "Weird Al Yankovic"}, "charliecloud", "charliecloud ($CH_RUNNING is set)"),
        (
            {"APPTAINER_CONTAINER": "/i.sif"},
            "apptainer",
            "Apptainer/Singularity ($APPTAINER_CONTAINER is set)",
        ),
    ],
)
def test_info_names_the_container_runtime(env: dict[str, str], name: str, row: str) -> None:
    """The table has a `container` row and --json a `container` field."""
    argv = [sys.executable, "-m", "distenv", "info", "--no-resolve"]
    child = {**scrubbed_environ(), "PYTHONPATH": str(REPO), **env}
    table = subprocess.run(argv, env=child, capture_output=True, text=True, timeout=60, check=True)
    assert f"\ncontainer             {row}\n" in table.stdout
    data = subprocess.run([*argv, "--json"], env=child, capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    assert json.loads(data.stdout)["container"] == name
