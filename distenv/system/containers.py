"""Which container runtime this process runs in, and how big its /dev/shm is.

Read from marker files and variables each runtime documents, with existence checks and one
``statvfs``: no subprocess, no file read. Pure over its inputs (the environment and a root
directory), so tests point it at a recorded tree.

- Apptainer/Singularity: ``$APPTAINER_CONTAINER`` or ``$SINGULARITY_CONTAINER`` (set even under
  ``--cleanenv``), ``/.singularity.d`` (Apptainer's "Environment and metadata" page).
- charliecloud: ``$CH_RUNNING``, which ``ch-run`` sets after ``--unset-env`` ran (ch-run(1),
  bin/ch-run.c).
- enroot/pyxis: ``/.lock``, the root file system's lock that enroot bind-mounts read-only
  (``enroot list`` finds containers by it), or the bundle's ``/.enroot`` (NVIDIA/enroot
  src/runtime.sh).
- podman: ``/run/.containerenv``, or ``$container`` = ``podman`` (podman-run(1)).
- docker: ``/.dockerenv``, which Docker creates in every container it starts.

Each runtime also has the flag that strips the environment (and with it every launcher's variables)
and the way to pass them in anyway: `distenv.detection.starters` names both when it refuses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["RUNTIMES", "SHM", "Container", "Runtime", "container", "shm_bytes"]

#: Where the POSIX shared memory of this machine (or container) lives.
SHM = "/dev/shm"  # noqa: S108 - read (statvfs), never written


class Runtime(NamedTuple):
    """One container runtime: how to recognise it, what strips the environment, the fix.

    Attributes:
        name: Its short name (``apptainer``, ``charliecloud``, ``enroot``, ``podman``, ``docker``).
        label: How `distenv info` shows it.
        variables: Variables only it sets inside its containers.
        files: Paths (relative to the root) only it creates inside its containers.
        strips: The flag or default that hides the host's variables from the container.
        fix: How to let the launcher's variables in.
    """

    name: str
    label: str
    variables: tuple[str, ...]
    files: tuple[str, ...]
    strips: str
    fix: str


RUNTIMES: tuple[Runtime, ...] = (
    Runtime(
        "apptainer",
        "Apptainer/Singularity",
        ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"),
        (".singularity.d",),
        "`apptainer exec --cleanenv` (or --containall, -C, -e)",
        "drop --cleanenv/--containall, or pass the launcher's variables in with "
        "`--env NAME=$NAME` or by exporting APPTAINERENV_<NAME> before `apptainer exec`",
    ),
    Runtime(
        "charliecloud",
        "charliecloud",
        ("CH_RUNNING",),
        (),
        "`ch-run --unset-env`",
        "run `ch-run` without --unset-env (or with --set-env for the launcher's variables)",
    ),
    Runtime(
        "enroot",
        "enroot/pyxis",
        (),
        (".lock", ".enroot"),
        "an enroot configuration or environ.d file that unsets them",
        "let the task's environment through (pyxis passes it by default; "
        "`enroot start -e NAME` passes one variable)",
    ),
    Runtime(
        "podman",
        "podman",
        (),
        ("run/.containerenv",),
        "`podman run`, which passes no host variable unless asked",
        "pass them with `podman run --env-host` or `-e NAME` for each",
    ),
    Runtime(
        "docker",
        "docker",
        (),
        (".dockerenv",),
        "`docker run`, which passes no host variable unless asked",
        "pass them with `docker run -e NAME` for each (or `--env-file`)",
    ),
)
_PODMAN = next(r for r in RUNTIMES if r.name == "podman")


class Container(NamedTuple):
    """The runtime this process runs in, and the marker that showed it (``CH_RUNNING is set``)."""

    runtime: Runtime
    evidence: str


def container(env: Mapping[str, str], root: str = "/") -> Container | None:
    """Return the container runtime this process runs in, or None where no marker is found.

    Args:
        env: The environment to read.
        root: The root directory whose marker files are checked (a recorded tree in tests).
    """
    for runtime in RUNTIMES:
        for name in runtime.variables:
            if env.get(name):
                return Container(runtime, f"${name} is set")
        for path in runtime.files:
            if os.path.lexists(os.path.join(root, path)):
                return Container(runtime, f"/{path} exists")
    if env.get("container") == "podman":  # podman-run(1) sets it; systemd reads it
        return Container(_PODMAN, "$container is 'podman'")
    return None


def shm_bytes(path: str = SHM) -> int | None:
    """Return the size of the file system at `path` (/dev/shm) in bytes, or None without one."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_frsize * stat.f_blocks
