"""Who started a process whose environment names no launcher: a stripped environment is refused.

A container runtime that strips the environment (``apptainer exec --cleanenv``, ``ch-run
--unset-env``) hides every launcher variable from the task it runs. ``auto`` would then answer
rank 0 of 1, and every task of the step would train alone and exit 0. The process tree still
shows who started the task: a launcher's per-node daemon is among its ancestors, or its cgroup
names a Slurm step. `refuse_stripped` refuses such a process, naming the daemon, the runtime's
stripping flag and the fix. ``--launcher none`` runs it alone on purpose.

- ``slurmstepd`` (argv ``slurmstepd: [JOB.STEP]``): slurm, slurmstepd(8).
- ``orted``, ``prted``, and on mpirun's own node ``mpirun``/``mpiexec``/``orterun``/``prterun``
  (its ranks there are its children, measured): mpi, Open MPI's mpirun(1).
- ``hydra_pmi_proxy``, ``pmi_proxy``: mpi, MPICH's Hydra (one proxy per node, measured).
- ``palsd``: pbs, HPE Cray PALS (its daemon starts every rank of ``mpiexec``).
- ``res``: lsf, LSF's Remote Execution Server (it starts ``blaunch`` tasks).
- ``flux-broker``, ``flux-broker-N``: flux, flux-broker(1) (the broker names itself by rank).

A cgroup path holding ``job_N/step_S`` (Slurm's cgroup plugins, ``/slurm/uid_U/job_N/step_S`` under
v1, ``.../job_N/step_S/...`` under v2) names a Slurm step where the tree does not (a container with
its own pid namespace: ``apptainer --containall``). Slurm's ``batch``, ``extern`` and
``interactive`` steps are one process by design, like a login shell: not a sign.

Pure over its input: the pipeline reads the ancestry and cgroup (`distenv.system.processes`) and the
container (`distenv.system.containers`) and passes them in as an `Origin`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from distenv.errors import StrippedEnvironmentError
from distenv.launchers.registry import get_launcher
from distenv.system.containers import RUNTIMES, Container
from distenv.system.processes import Ancestor

__all__ = ["COMMANDS_OF", "DAEMONS", "Origin", "Starter", "refuse_stripped", "started_by"]

#: Launch daemons by their ``comm`` (15 characters at most), and the launcher whose tasks they run.
DAEMONS: dict[str, str] = {
    "slurmstepd": "slurm",
    "orted": "mpi",
    "prted": "mpi",
    "orterun": "mpi",
    "prterun": "mpi",
    "mpirun": "mpi",
    "mpirun.openmpi": "mpi",
    "mpiexec": "mpi",
    "mpiexec.openmpi": "mpi",
    "hydra_pmi_proxy": "mpi",
    "pmi_proxy": "mpi",
    "palsd": "pbs",
    "res": "lsf",
    "flux-broker": "flux",
}
#: The daemons whose command line is read: slurmstepd's names its step.
COMMANDS_OF = frozenset({"slurmstepd"})
#: Slurm steps that are one process by design (slurmstepd's argv, the cgroup's ``step_`` name).
SINGLE_STEPS = frozenset({"batch", "extern", "interactive"})

# "[5.0]", "[5.batch]"; an array element's job may read "5_3". The cgroup has the job's number.
_STEP_ARGV = r"\[([^\].\s]+)\.([^\]\s]+)\]"
_STEP_CGROUP = r"/job_(\d+)/step_(\w+)"


class Origin(NamedTuple):
    """What the process tree says about this process (read by the pipeline, passed in)."""

    ancestors: tuple[Ancestor, ...]
    cgroup: str
    container: Container | None


class Starter(NamedTuple):
    """The launcher whose task this process is, and what showed it."""

    launcher: str
    what: str


def _daemon(name: str) -> str | None:
    if name.startswith("flux-broker"):  # "flux-broker-0": the broker names itself by its rank
        return "flux"
    return DAEMONS.get(name)


def started_by(origin: Origin) -> Starter | None:
    """Return the launcher that started this process as one of its tasks, or None.

    The nearest ancestor that is a launch daemon answers; without one, the cgroup's Slurm step.
    """
    for ancestor in origin.ancestors:
        launcher = _daemon(ancestor.name)
        if launcher is None:
            continue
        what = f"{ancestor.name} (pid {ancestor.pid}"
        step = re.search(_STEP_ARGV, ancestor.command) if launcher == "slurm" else None
        if step is not None:
            if step[2] in SINGLE_STEPS:
                return None
            what += f", step {step[1]}.{step[2]}"
        return Starter(launcher, what + ")")
    for line in origin.cgroup.splitlines():
        step = re.search(_STEP_CGROUP, line)
        if step is not None:
            if step[2] in SINGLE_STEPS:
                return None
            return Starter("slurm", f"Slurm step {step[1]}.{step[2]} (cgroup {line.strip()!r})")
    return None


def refuse_stripped(origin: Origin) -> None:
    """Refuse a process that a launcher started but whose environment holds none of its variables.

    Raises:
        StrippedEnvironmentError: If `started_by` finds the launcher.
    """
    starter = started_by(origin)
    if starter is None:
        return
    variables = get_launcher(starter.launcher).variables
    listed = ", ".join(v.name for v in variables[:3])
    found = origin.container
    if found is not None:
        runtime = found.runtime
        how = f"it runs in {runtime.label} ({found.evidence}), where {runtime.strips} removes them"
        fix = runtime.fix
    else:
        how = (
            "something between them removed them: a container run with "
            + ", ".join(r.strips for r in RUNTIMES if r.name != "enroot")
            + ", or `env -i`"
        )
        fix = "; ".join(
            r.fix for r in RUNTIMES if r.name in ("apptainer", "charliecloud", "podman")
        )
    raise StrippedEnvironmentError(
        starter.launcher,
        f"this process was started by {starter.what}, but none of {starter.launcher}'s "
        f"variables ({listed}, ...) reach it: {how}; run alone it would be rank 0 of 1, a "
        "separate training on every task",
        hint=f"{fix}; to run this process alone on purpose, pass --launcher none",
        variable=variables[0].name if variables else None,
    )
