"""The `sge` launcher backend: Grid Engine jobs (Sun/Oracle, Univa/Altair, Son of Grid Engine).

Grid Engine cannot be installed on the project's test machines; the tests use environments
recorded from its sources and manual pages (gridengine/gridengine 6a5407d, the last Sun/Oracle
open-source tree as Son of Grid Engine carries it: ``source/daemons/execd/exec_job.c``,
``doc/man/man1/submit.1`` "ENVIRONMENTAL VARIABLES", ``doc/man/man5/sge_pe.5``), and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname, read_host_text
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
    shown,
    warn,
)
from distenv.launchers.base import Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["GridEngineLauncher"]

SGE_SETS = "Grid Engine sets it in the job; never set it by hand"
LAUNCH_HINT = (
    "start the ranks with the MPI launcher inside the job: `mpirun -np $NSLOTS python train.py` "
    "(Open MPI and MPICH's Hydra start them on every host of $PE_HOSTFILE through `qrsh "
    "-inherit`, Grid Engine's tight integration), or on a one-host job `distenv run "
    "--nproc-per-node $NSLOTS train.py`"
)
MASTER_HINT = (
    "export MASTER_ADDR=$(hostname) in the job script before mpirun (the script runs on "
    "$PE_HOSTFILE's first host), or let the MPI launcher forward PE_HOSTFILE to every rank "
    "(Open MPI's `qrsh -inherit -V` does)"
)


class GridEngineLauncher(Scheduler):
    """A Grid Engine job; the ranks of a parallel-environment job are started by MPI inside it.

    | variable | fills | required |
    |---|---|---|
    | JOB_ID | job_id, detection, scope, master_port | yes |
    | SGE_JOB_SPOOL_DIR | detection (the shepherd's directory of this job) | JOB_ID's partner |
    | SGE_TASK_ID | scope: the array task ('undefined' outside arrays) | no |
    | PE | the parallel environment's name (parallel jobs only) | no |
    | NSLOTS | the job script's slots: above 1 it is refused | no |
    | NHOSTS | checked against PE_HOSTFILE's hosts | no |
    | PE_HOSTFILE | master_addr for MPI ranks: its first host; detection | in a parallel job |
    | RESTARTED | restart_count: 1 when '1' (a flag, not a count) | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Grid Engine numbers no rank: the process it starts is the job script, on the master task's
    host. A script of a parallel-environment job with ``NSLOTS`` above 1 would be rank 0 of N
    and is refused like Slurm's batch step; a 1-slot job (every serial job) is rank 0 of 1.
    MPI ranks inside the job (Open MPI's ``mpirun`` and MPICH's Hydra start their daemons with
    ``qrsh -inherit``) are the `mpi` launcher's, with the master on the first host of
    ``PE_HOSTFILE`` (``host slots queue processors``, one line per queue instance, the master
    task's host first: exec_job.c) and a port derived from the job. The execd gives
    ``PE_HOSTFILE`` to the master task only; a rank that lacks it, or cannot read it, is refused
    (unless ``MASTER_ADDR`` is set) rather than guess while the others read it.
    """

    name = "sge"
    aliases = ("gridengine", "uge")
    how_to_start = (
        "submit it: `qsub job.sh` whose script asks for slots (`#$ -pe mpi 8`) and runs "
        "`mpirun -np $NSLOTS python train.py`"
    )
    variables = (
        Var("JOB_ID", "job_id", "yes", "the job id, a decimal number (submit(1))"),
        Var("SGE_JOB_SPOOL_DIR", "(detection)", "JOB_ID's partner", "sge_shepherd's job dir"),
        Var("SGE_TASK_ID", "(export tag)", "no", "array task index; 'undefined' outside arrays"),
        Var("PE", "(job script)", "no", "the parallel environment (parallel jobs only)"),
        Var("NSLOTS", "world_size", "no", "slots of the job; above 1 only in a parallel job"),
        Var("NHOSTS", "num_nodes", "no", "hosts of a parallel job"),
        Var(
            "PE_HOSTFILE",
            "master_addr",
            "in a parallel job",
            "file: 'host slots queue processors' per line, the master task's host first",
        ),
        Var("RESTARTED", "restart_count", "no", "'1' in a job restarted after a crash, else '0'"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        return reader.has("JOB_ID") and (
            reader.has("SGE_JOB_SPOOL_DIR") or reader.has("PE_HOSTFILE")
        )

    def world(self, env: Mapping[str, str]) -> World | None:
        return None  # Grid Engine states no rank: the script is not one

    def _job(self, reader: Reader) -> str | None:
        """Return JOB_ID, None if unset; a job id is a decimal number (submit(1))."""
        job = reader.get("JOB_ID")
        if job is not None:
            reader.parse_int("JOB_ID", job, hint=SGE_SETS, minimum=1, maximum=2**32)
        return job and job.strip()

    def _key(self, reader: Reader) -> str | None:
        """Return the job id with its array task (``42[7]``), or None outside a job."""
        job = self._job(reader)
        task = reader.get("SGE_TASK_ID")
        if job is None or task is None or task == "undefined":
            return job
        number = reader.parse_int(
            "SGE_TASK_ID", task, hint=SGE_SETS + " ('undefined' outside array jobs)", minimum=1
        )
        return f"{job}[{number}]"

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self._key(self.reader(env)), None)

    def restart_count(self, env: Mapping[str, str]) -> int:
        # RESTARTED is a flag (submit(1)): 1 after a system crash or a checkpoint migration.
        flag = self.reader(env).get("RESTARTED")
        if flag not in (None, "0", "1"):
            raise InvalidVariableError(self.name, "RESTARTED", flag, "'0' or '1'", hint=SGE_SETS)
        return 1 if flag == "1" else 0

    def _slots(self, reader: Reader) -> int | None:
        return reader.optional_int("NSLOTS", hint=SGE_SETS, minimum=1)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        job = self._key(reader)
        if job is None:
            raise MissingVariableError(self.name, "JOB_ID", hint="run inside a Grid Engine job")
        slots = self._slots(reader)
        if slots is not None and slots > 1:
            pe = reader.get("PE")
            where = f"parallel environment {shown(pe)}" if pe else "a parallel environment"
            raise NotLaunchedError(
                self.name,
                f"this process is job {job}'s script (no MPI rank variables) and $NSLOTS is "
                f"{slots} in {where}: it would run as rank 0 of {slots} and wait forever for "
                "the others",
                hint=LAUNCH_HINT,
                variable="NSLOTS",
                value=str(slots),
            )
        if reader.has("PE"):
            warn("sge: job %s has one slot and this is its script; running as rank 0 of 1", job)
        return RankInfo.single(
            self.name, master_addr=None, job_id=job, restart_count=self.restart_count(env)
        )

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        job = self._key(self.reader(env))
        if job is None:
            return None
        return Default(LOCAL_HOST, scheduler_port(job, "script"), source=self.name)

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        job = self._key(reader)
        if job is None or not (reader.has("PE") or reader.has("PE_HOSTFILE")):
            return None  # a serial job: MPI ranks on this host alone need no allocation
        if reader.has("MASTER_ADDR"):
            return None  # the user's address wins (distenv.master): the file is not read
        _, path = reader.require("PE_HOSTFILE", hint=MASTER_HINT)
        host = self.pe_hosts(reader, path)[0][0]
        return Default(host, scheduler_port(job, "mpi"), source=self.name, variable="PE_HOSTFILE")

    def pe_hosts(self, reader: Reader, path: str) -> list[tuple[str, int]]:
        """Return PE_HOSTFILE's hosts with their slots, in order, checked against the job's counts.

        sge_pe(5): each line is ``host slots queue processors``; a host with slots in several
        queues has one line per queue. Read as a regular file, bounded in size and time.
        """
        text = read_host_text(
            self.name, "PE_HOSTFILE", path, "PE host file", shape="'host slots queue processors'"
        )
        hosts: list[tuple[str, int]] = []
        for line in text.splitlines():
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 2:
                raise InvalidVariableError(
                    self.name,
                    "PE_HOSTFILE",
                    path,
                    f"lines of 'host slots queue processors', not {shown(line)}",
                    hint=MASTER_HINT,
                )
            host = check_hostname(self.name, "PE_HOSTFILE", fields[0], hint=MASTER_HINT)
            slots = reader.parse_int("PE_HOSTFILE", fields[1], hint=MASTER_HINT, minimum=1)
            hosts.append((host, slots))
        if not hosts:
            raise InvalidVariableError(
                self.name, "PE_HOSTFILE", path, "a PE host file naming at least one host"
            )
        self._check_counts(reader, hosts)
        return hosts

    def _check_counts(self, reader: Reader, hosts: list[tuple[str, int]]) -> None:
        """Refuse a PE host file whose slots or hosts disagree with NSLOTS or NHOSTS."""
        total = sum(slots for _, slots in hosts)
        distinct = len(dict.fromkeys(host for host, _ in hosts))
        for var, stated, counted, what in (
            ("NSLOTS", self._slots(reader), total, "slots"),
            ("NHOSTS", reader.optional_int("NHOSTS", hint=SGE_SETS, minimum=1), distinct, "hosts"),
        ):
            if stated is not None and stated != counted:
                raise InconsistentEnvironmentError(
                    self.name,
                    f"${var} is {stated} but $PE_HOSTFILE lists {counted} {what}: they come "
                    "from another job, or were set by hand",
                    hint="let Grid Engine set NSLOTS, NHOSTS and PE_HOSTFILE; never override them",
                    variable=var,
                    value=str(stated),
                )
