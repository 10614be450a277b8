"""The `pbs` launcher backend: PBS Professional / OpenPBS jobs, whose ranks an MPI launcher starts.

PBS cannot be installed on the project's test machines; the tests use environments recorded from
OpenPBS's sources (v23.06, ``src/resmom/start_exec.c``, ``catch_child.c``, ``mom_comm.c``) and
from the documentation of Cray PALS sites (ALCF Polaris and Aurora), and the docs say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distenv._hosts import read_host_file
from distenv.errors import InvalidVariableError, NotLaunchedError, warn
from distenv.launchers.base import Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["PbsLauncher"]

# OpenPBS's job ids (qsub(1B), "Job Identifier"): a sequence number, an array's brackets with
# or without an index, then the server's name.
JOB_ID = r"[0-9]{1,20}(?:\[[0-9]{0,20}\])?(?:\.[A-Za-z0-9._-]{1,255})?"
LAUNCH_HINT = (
    "start the ranks with the MPI launcher inside the job: `mpiexec -n 8 --ppn 4 python "
    "train.py` (Cray PALS, MPICH) or `mpirun -np 8 python train.py` (Open MPI)"
)


class PbsLauncher(Scheduler):
    """A PBS Professional or OpenPBS job; its ranks are started by an MPI launcher inside it.

    | variable | fills | required |
    |---|---|---|
    | PBS_JOBID | job_id, detection, scope | yes |
    | PBS_NODEFILE | the job script's slots: one line per MPI process of each vnode | in the script |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    PBS numbers no rank: the process it starts is the job script (or a task of ``pbsdsh``), rank
    0 of 1 when the node file lists one slot and refused otherwise (it would be rank 0 of N).
    MPI ranks inside the job (Cray PALS's ``mpiexec``, Open MPI's ``mpirun``) are the `mpi`
    launcher's; PBS gives them no master: OpenPBS writes ``PBS_NODEFILE`` on the mother superior
    only, and on the other nodes only where ``gen_nodefile_on_sister_mom`` is set, so a rank on
    another node may not read what rank 0 reads. The master then comes from ``MASTER_ADDR`` or is
    exchanged over MPI, as without PBS. ``PBS_TASKNUM`` is never read: the script's is decimal,
    a ``pbsdsh`` task's hexadecimal (``%8.8X``), and neither is a rank. OpenPBS sets no node count.
    """

    name = "pbs"
    aliases = ("openpbs", "pbspro")
    how_to_start = "submit it: `qsub job.pbs` whose script runs `mpiexec -n N --ppn P python ...`"
    variables = (
        Var("PBS_JOBID", "job_id", "yes", "the job id ('1234.server'); its presence means PBS"),
        Var(
            "PBS_NODEFILE",
            "(job script)",
            "in the script",
            "file: one line per MPI process of each vnode, mother superior first",
        ),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("PBS_JOBID")

    def world(self, env: Mapping[str, str]) -> World | None:
        return None  # PBS states no rank of its own: the script is not a rank

    def _job(self, reader: Reader) -> str | None:
        """Return PBS_JOBID (``1234.server``, an array's ``1234[].server``), None if unset."""
        job = reader.get("PBS_JOBID")
        if job is not None and not re.fullmatch(JOB_ID, job):
            raise InvalidVariableError(
                self.name,
                "PBS_JOBID",
                job,
                "a PBS job id such as '1234.server' or '1234[5].server'",
                hint="PBS sets it in the job; never set it by hand",
            )
        return job

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self._job(self.reader(env)), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        # Read here, when PBS itself answers: the script runs on the mother superior, which
        # always holds the node file (src/resmom/start_exec.c, generate_pbs_nodefile).
        reader = self.reader(env)
        hint = "run inside a PBS job (qsub)"
        job_id = self._job(reader) or reader.require("PBS_JOBID", hint=hint)[1]
        path = reader.require("PBS_NODEFILE", hint="run inside a PBS job (qsub)")[1]
        slots = len(read_host_file(self.name, "PBS_NODEFILE", path, "node file"))
        if slots > 1:
            raise NotLaunchedError(
                self.name,
                f"this process is job {job_id}'s script (or a task of pbsdsh), not a rank, and "
                f"$PBS_NODEFILE lists {slots} slots: it would run as rank 0 of {slots} and wait "
                "forever for the others",
                hint=LAUNCH_HINT,
                variable="PBS_NODEFILE",
                value=path,
            )
        warn("pbs: job %s has one slot and this is its script; running as rank 0 of 1", job_id)
        return RankInfo.single(self.name, master_addr=None, job_id=job_id)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        job = self._job(self.reader(env))
        if job is None:
            return None
        return Default(LOCAL_HOST, scheduler_port(job, "script"), source=self.name)

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None  # the node file may be absent on the other nodes (see the class docstring)
