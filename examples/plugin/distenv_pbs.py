"""A distenv launcher plug-in for one PBS site, written against distenv's public contract only.

distenv's built-in `pbs` backend gives MPI ranks no master: OpenPBS writes ``$PBS_NODEFILE`` on
the other nodes only where the MoMs set ``gen_nodefile_on_sister_mom``, so it cannot assume a rank
there reads it, and the master is exchanged over MPI. A site that sets it everywhere can do
better, and this plug-in does: as a `Scheduler` it takes part in distenv's nesting like the
built-in Slurm and LSF, MPI ranks take the master from the allocation (the first host of
``$PBS_NODEFILE``) instead of asking rank 0 over MPI, and the job script is refused when it would
run as "rank 0 of N".

Install it, then opt in to auto detection: ``DISTENV_PLUGINS=sitepbs``.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv import RankInfo
from distenv.errors import InvalidVariableError, NotLaunchedError
from distenv.launchers import (
    MASTER_VARS,
    Default,
    Reader,
    Scheduler,
    Var,
    World,
    scheduler_port,
    scope_tag,
)

LAUNCH_HINT = "start the ranks with mpiexec inside the job (e.g. `mpiexec -n 8 python train.py`)"
# $PBS_NODEFILE lists one host per MPI process; a file this large is not a host list.
MAX_NODEFILE_BYTES = 16 * 1024 * 1024


class PbsScheduler(Scheduler):
    """A PBS Pro job on a site whose every MoM writes the node file (gen_nodefile_on_sister_mom).

    | variable | fills | required |
    |---|---|---|
    | PBS_JOBID | job_id, detection | yes |
    | PBS_NODEFILE | the allocation's hosts: a file, one line per MPI process | yes |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    PBS itself starts no rank: the process it runs is the job script, rank 0 of 1 when the job
    holds one slot and refused otherwise. MPI ranks inside the job use the first host of the
    node file as master, with a port derived from the job id.
    """

    name = "sitepbs"
    variables = (
        Var("PBS_JOBID", "job_id", "yes", "the job id ('1234.server'); its presence means PBS"),
        Var("PBS_NODEFILE", "master_addr", "yes", "file naming the hosts, one line per process"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("PBS_JOBID")

    def _hosts(self, reader: Reader) -> list[str]:
        """Return the node file's hosts, one per slot, in PBS's order."""
        path = reader.require("PBS_NODEFILE", hint="run inside a PBS job (qsub)")[1]
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_NODEFILE_BYTES + 1)
        except OSError as exc:
            raise InvalidVariableError(
                self.name, "PBS_NODEFILE", path, f"a readable node file ({exc.strerror})"
            ) from None
        hosts = data.decode("utf-8", "replace").split()
        if not hosts or len(data) > MAX_NODEFILE_BYTES:
            raise InvalidVariableError(self.name, "PBS_NODEFILE", path, "a file of host names")
        return hosts

    def world(self, env: Mapping[str, str]) -> World | None:
        return None  # PBS states no rank of its own: the script is not a rank

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("PBS_JOBID"), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        job_id = reader.require("PBS_JOBID", hint="run inside a PBS job (qsub)")[1]
        slots = len(self._hosts(reader))
        if slots > 1:
            raise NotLaunchedError(
                self.name,
                f"this process is job {job_id}'s script, which holds {slots} slots: it would "
                f"run as rank 0 of {slots} and wait forever for the others",
                hint=LAUNCH_HINT,
                variable="PBS_NODEFILE",
            )
        return RankInfo.single(self.name, master_addr=None, job_id=job_id)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        job = self.reader(env).get("PBS_JOBID")
        return None if job is None else Default("127.0.0.1", scheduler_port(job, "script"))

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        job = reader.get("PBS_JOBID")
        if job is None or not reader.has("PBS_NODEFILE"):
            return None
        return Default(self._hosts(reader)[0], scheduler_port(job, "mpi"), source=self.name)
