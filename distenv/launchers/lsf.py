"""The `lsf` launcher backend: IBM Spectrum LSF jobs, ranks started by ``jsrun`` or ``blaunch``.

LSF cannot be installed on the project's test machines; the tests use environments recorded from
IBM's documentation (LSF 10.1 "Environment variables", jsrun(1), blaunch(1)) and from the sources
that read LSF's task variables (Open MPI's ``ess/lsf``), and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname, read_host_file
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
    warn,
)
from distenv.launchers.base import Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import MAX_COUNT, Reader, Var

__all__ = ["LsfLauncher"]

JSRUN_HINT = (
    "start the ranks with jsrun (e.g. `jsrun -r 4 -g 1 python train.py`), or one per slot with "
    "`blaunch python train.py`"
)
BLAUNCH_HINT = (
    "start one task per slot with `blaunch python train.py` (no host list) inside the bsub job"
)
# Where each kind of process finds the job's slots: jsrun's rank file first; blaunch runs one task
# per slot of the job's host file (blaunch(1): "one remote task per job slot").
JSRUN_SLOTS = ("LSB_DJOB_RANKFILE", "LSB_MCPU_HOSTS", "LSB_HOSTS")
BLAUNCH_SLOTS = ("LSB_DJOB_HOSTFILE", "LSB_DJOB_RANKFILE", "LSB_MCPU_HOSTS", "LSB_HOSTS")
FILE_VARS = ("LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE")
LSF_SETS = "LSF sets it; never set it by hand"


class LsfLauncher(Scheduler):
    """Ranks started by ``jsrun`` or ``blaunch`` in an LSF job.

    | variable | fills | required |
    |---|---|---|
    | LSB_JOBID | job_id, detection | yes |
    | LSB_JOBINDEX | master_port (array element), scope, requeue target | no |
    | LSB_RESTART | restart_count: 1 when "Y" (a flag, not a count) | no |
    | PMIX_NAMESPACE | scope: one jsrun step | no |
    | JSM_NAMESPACE_RANK | rank | under jsrun |
    | JSM_NAMESPACE_SIZE | world_size | under jsrun |
    | JSM_NAMESPACE_LOCAL_RANK | local_rank | under jsrun |
    | JSM_NAMESPACE_LOCAL_SIZE | local_world_size | under jsrun |
    | LSF_PM_TASKID | rank (minus 1: it counts from 1) | under blaunch |
    | LSB_DJOB_NUMPROC | world_size under blaunch (slots of the job) | no |
    | LSB_DJOB_HOSTFILE | blaunch's slots (file, one host per slot): layout, master | under blaunch |
    | LSB_DJOB_RANKFILE | master_addr: file, one host per slot (the first of these three set) | one host list |
    | LSB_MCPU_HOSTS | master_addr: 'host slots host slots ...' | one host list |
    | LSB_HOSTS | master_addr: one host per slot (LSF drops it past 4096 bytes) | one host list |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    node_rank is ``rank // local_world_size`` (jsrun places resource sets node by node). Under jsrun
    a first host holding a single slot is the launch node of CORAL-style systems
    (``batch2 1 h22n07 42 h22n08 42``) and owns no rank: it is dropped. Without jsrun the first host
    runs ranks, and the batch script of a multi-slot job is refused like Slurm's.

    ``blaunch`` without a host list runs one task per slot (blaunch(1)); task ``LSF_PM_TASKID``
    (1-based) is the slot of that line of ``LSB_DJOB_HOSTFILE``, the correspondence Open MPI's
    ``ess/lsf`` relies on for its daemons. The node layout and the master come from that file.
    `world` states jsrun's ranks only: an MPI rank whose daemon ``blaunch`` started inherits the
    daemon's ``LSF_PM_TASKID`` (mpirun's own node has none), which numbers no MPI rank.
    """

    name = "lsf"
    how_to_start = (
        "submit it: `bsub job.bsub` whose script runs `jsrun ... python train.py ...` "
        "(`distenv template lsf/jsrun.bsub` prints one)"
    )
    variables = (
        Var("LSB_JOBID", "job_id", "yes", "the LSF job id; its presence means an LSF job"),
        Var("LSB_JOBINDEX", "master_port", "no", "array element index (0 outside arrays)"),
        Var("LSB_RESTART", "restart_count", "no", "'Y' in a restarted (requeued) job: 1"),
        Var("PMIX_NAMESPACE", "(export tag)", "no", "jsrun's PMIx namespace: one jsrun step"),
        Var("JSM_NAMESPACE_RANK", "rank", "under jsrun", "global rank"),
        Var("JSM_NAMESPACE_SIZE", "world_size", "under jsrun", "number of ranks"),
        Var("JSM_NAMESPACE_LOCAL_RANK", "local_rank", "under jsrun", "rank on this node"),
        Var("JSM_NAMESPACE_LOCAL_SIZE", "local_world_size", "under jsrun", "ranks on this node"),
        Var("LSF_PM_TASKID", "rank", "under blaunch", "blaunch's task id, from 1 (rank + 1)"),
        Var("LSB_DJOB_NUMPROC", "world_size", "no", "slots of the job: blaunch's task count"),
        Var("LSB_DJOB_HOSTFILE", "node_rank", "under blaunch", "file, one host per slot"),
        Var("LSB_DJOB_RANKFILE", "master_addr", "one host list", "file, one host per slot"),
        Var("LSB_MCPU_HOSTS", "master_addr", "one host list", "'hostA 4 hostB 4'"),
        Var("LSB_HOSTS", "master_addr", "one host list", "'hostA hostA hostB hostB'"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("LSB_JOBID")

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        rank = reader.optional_int("JSM_NAMESPACE_RANK")
        if rank is None:
            return None
        return rank, reader.optional_int("JSM_NAMESPACE_SIZE", minimum=1)

    def scope(self, env: Mapping[str, str]) -> str:
        reader = self.reader(env)
        job, index = self._job(reader), self._index(reader)
        # jsrun is PMIx based: its namespace tells two jsrun steps of one job apart.
        step = reader.get("PMIX_NAMESPACE") or "-"
        return scope_tag(self.name, job and f"{job}[{index}]", step)

    def _job(self, reader: Reader) -> str | None:
        """Return LSB_JOBID, None outside a job; a job id is a number (bjobs(1))."""
        job = reader.get("LSB_JOBID")
        if job is not None:
            reader.parse_int("LSB_JOBID", job, hint=LSF_SETS, maximum=2**31)
        return job

    def _index(self, reader: Reader) -> int:
        """Return the array element's index (LSB_JOBINDEX; 0 outside arrays)."""
        return reader.optional_int("LSB_JOBINDEX", hint=LSF_SETS) or 0

    def _port(self, reader: Reader) -> int:
        # Elements of a job array share LSB_JOBID; LSB_JOBINDEX tells them apart.
        return scheduler_port(self._job(reader) or "0", str(self._index(reader)))

    def _slots(self, reader: Reader, order: tuple[str, ...] = JSRUN_SLOTS) -> list[tuple[str, int]]:
        """Return the job's hosts with their slot counts, in LSF's order."""
        found = reader.first(*order)
        if found is None:
            raise InvalidVariableError(
                self.name,
                "LSB_MCPU_HOSTS",
                "",
                "the job's host list ('hostA 4 hostB 4')",
                hint="run inside an LSF job started by bsub, or set MASTER_ADDR",
            )
        var, value = found
        if var == "LSB_MCPU_HOSTS":
            words = value.split()
            if len(words) % 2 or not words:
                raise InvalidVariableError(self.name, var, value, "pairs of 'host slots'")
            slots = [
                (check_hostname(self.name, var, host), reader.parse_int(var, count, minimum=1))
                for host, count in zip(words[::2], words[1::2], strict=True)
            ]
            if sum(count for _, count in slots) > MAX_COUNT:
                raise InvalidVariableError(self.name, var, value, f"at most {MAX_COUNT} slots")
            return slots
        if var in FILE_VARS:
            kind = "rank file" if var == "LSB_DJOB_RANKFILE" else "host file"
            words = read_host_file(self.name, var, value, kind)
        else:
            words = value.split()
        pairs: list[tuple[str, int]] = []
        for host in words:
            check_hostname(self.name, var, host)
            if pairs and pairs[-1][0] == host:
                pairs[-1] = (host, pairs[-1][1] + 1)
            else:
                pairs.append((host, 1))
        if not pairs:
            raise InvalidVariableError(self.name, var, value, "at least one host")
        return pairs

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not reader.has("LSB_JOBID"):
            return None
        slots = self._slots(reader)
        if len(slots) > 1 and slots[0][1] == 1:
            # A first host with one slot is a CSM site's launch node (no rank) or a host where
            # mpirun put rank 0: nothing tells which, so the master is exchanged over MPI.
            return None
        return Default(slots[0][0], self._port(reader), source=self.name)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not reader.has("LSB_JOBID"):
            return None
        if reader.has("JSM_NAMESPACE_RANK"):
            return Default(self._rank_hosts(reader)[0][0], self._port(reader), source=self.name)
        if reader.has("LSF_PM_TASKID"):  # task 1 runs on the first slot
            host = self._slots(reader, BLAUNCH_SLOTS)[0][0]
            return Default(host, self._port(reader), source=self.name)
        # a 1-slot batch script (a larger one is refused)
        return Default(LOCAL_HOST, self._port(reader), source=self.name)

    def _rank_hosts(self, reader: Reader) -> list[tuple[str, int]]:
        """Return the hosts that run jsrun's ranks, with their slot counts."""
        slots = self._slots(reader)
        if len(slots) > 1 and slots[0][1] == 1:
            slots = slots[1:]  # the launch node of CORAL systems (Summit, Sierra) runs no rank
        return slots

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        job_id = self._job(reader)
        if job_id is None:
            raise MissingVariableError(self.name, "LSB_JOBID", hint="run inside an LSF job (bsub)")
        if not reader.has("JSM_NAMESPACE_RANK"):
            if reader.has("LSF_PM_TASKID"):
                return self._blaunch_task(reader, job_id)
            return self._outside_jsrun(reader, job_id, self._slots(reader))
        self._rank_hosts(reader)  # validates the host list before the layout is trusted
        rank = reader.integer("JSM_NAMESPACE_RANK", hint=JSRUN_HINT)
        world_size = reader.integer("JSM_NAMESPACE_SIZE", hint=JSRUN_HINT, minimum=1)
        local_rank = reader.integer("JSM_NAMESPACE_LOCAL_RANK", hint=JSRUN_HINT)
        local_size = reader.integer("JSM_NAMESPACE_LOCAL_SIZE", hint=JSRUN_HINT, minimum=1)
        if world_size % local_size:
            raise InconsistentEnvironmentError(
                self.name,
                f"$JSM_NAMESPACE_SIZE={world_size} is not a multiple of "
                f"$JSM_NAMESPACE_LOCAL_SIZE={local_size}, so the node layout is unknown",
                hint="give every node the same number of resource sets (jsrun -r N)",
            )
        return RankInfo.checked(
            self.name,
            {
                "rank": "JSM_NAMESPACE_RANK",
                "world_size": "JSM_NAMESPACE_SIZE",
                "local_rank": "JSM_NAMESPACE_LOCAL_RANK",
                "local_world_size": "JSM_NAMESPACE_LOCAL_SIZE",
            },
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_size,
            node_rank=rank // local_size,
            num_nodes=world_size // local_size,
            master_addr=None,
            master_port=None,
            job_id=job_id,
            restart_count=self.restart_count(env),
        )

    def restart_count(self, env: Mapping[str, str]) -> int:
        # LSB_RESTART is a flag, not a count (LSF "Environment variables reference"): "Y" in a
        # job restarted by brequeue or as rerunnable.
        flag = self.reader(env).get("LSB_RESTART")
        if flag not in (None, "Y", "N"):
            raise InvalidVariableError(self.name, "LSB_RESTART", flag, "'Y' or 'N'", hint=LSF_SETS)
        return 1 if flag == "Y" else 0

    def requeue_command(self, env: Mapping[str, str]) -> list[str] | None:
        reader = self.reader(env)
        # A job id is a number; anything else would be read as one of brequeue's options.
        job = self._job(reader)
        if job is None:
            return None
        # An array element is JOBID[INDEX]; the bare id would requeue every element (brequeue(1)).
        index = self._index(reader)
        return ["brequeue", f"{job.strip()}[{index}]" if index else job.strip()]

    def _blaunch_task(self, reader: Reader, job_id: str) -> RankInfo:
        """A task of ``blaunch`` without a host list: one per slot of LSB_DJOB_HOSTFILE."""
        task = reader.integer("LSF_PM_TASKID", hint=BLAUNCH_HINT, minimum=1)
        slots = self._slots(reader, BLAUNCH_SLOTS)
        slot_var = (reader.first(*BLAUNCH_SLOTS) or BLAUNCH_SLOTS)[0]
        total = sum(count for _, count in slots)
        numproc = reader.optional_int("LSB_DJOB_NUMPROC", minimum=1)
        if numproc is not None and numproc != total:
            raise InconsistentEnvironmentError(
                self.name,
                f"$LSB_DJOB_NUMPROC={numproc} but the job's host file lists {total} slots",
                hint="let LSF set LSB_DJOB_NUMPROC and LSB_DJOB_HOSTFILE; never override them",
                variable="LSB_DJOB_NUMPROC",
                value=str(numproc),
            )
        if task > total:
            raise InvalidVariableError(
                self.name,
                "LSF_PM_TASKID",
                str(task),
                f"a task id in [1, {total}]: blaunch without a host list runs one task per "
                f"slot, and the job has {total}",
                hint=BLAUNCH_HINT + "; with a host list (-z, -u) set RANK, WORLD_SIZE, "
                "LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_* yourself and use --launcher pytorch",
            )
        rank = task - 1
        # The slot of task `task`, counted over the runs of slots without expanding them.
        start, at = 0, 0
        while start + slots[at][1] <= rank:
            start += slots[at][1]
            at += 1
        host = slots[at][0]
        local_rank = rank - start + sum(count for name, count in slots[:at] if name == host)
        nodes = list(dict.fromkeys(name for name, _ in slots))  # in order of their first slot
        return RankInfo.checked(
            self.name,
            {"rank": "LSF_PM_TASKID", "world_size": slot_var, "node_rank": slot_var},
            rank=rank,
            world_size=total,
            local_rank=local_rank,
            local_world_size=sum(count for name, count in slots if name == host),
            node_rank=nodes.index(host),
            num_nodes=len(nodes),
            master_addr=None,
            master_port=None,
            job_id=job_id,
            restart_count=self.restart_count(reader.env),
        )

    def _outside_jsrun(self, reader: Reader, job_id: str, slots: list[tuple[str, int]]) -> RankInfo:
        total = sum(count for _, count in slots)
        if total > 1:
            raise NotLaunchedError(
                self.name,
                f"this process is job {job_id}'s batch script (no $JSM_NAMESPACE_RANK or "
                "$LSF_PM_TASKID) but the job "
                f"holds {total} slots: it would run as rank 0 of {total} and wait forever",
                hint=JSRUN_HINT,
                variable="JSM_NAMESPACE_RANK",
            )
        warn("lsf: job %s has one slot; running as rank 0 of 1", job_id)
        return RankInfo.single(
            self.name,
            master_addr=None,
            job_id=job_id,
            restart_count=self.restart_count(reader.env),
        )
