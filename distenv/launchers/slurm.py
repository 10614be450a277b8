"""The `slurm` launcher backend: tasks started by ``srun``."""

from __future__ import annotations

import re
from collections.abc import Mapping

from distenv._hosts import expand_nodelist, expand_tasks_per_node
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    NotLaunchedError,
    shown,
    warn,
)
from distenv.launchers.base import Nodes, Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["SlurmLauncher"]

SRUN_HINT = (
    "start one task per GPU with `srun python train.py ...`, not from the batch script itself"
)

# Step ids above this are Slurm's special steps, not srun launches (slurm.h, Slurm >= 20.11:
# SLURM_MAX_NORMAL_STEP_ID = 0xfffffff0). Of those, only salloc's interactive step
# (LaunchParameters=use_interactive_step) runs the user's command as a real 1-task step.
MAX_NORMAL_STEP_ID = 0xFFFFFFF0
INTERACTIVE_STEP_ID = 0xFFFFFFFA

# Step-level variables first: a step may use a subset of the allocation (srun -N2 -r2). The
# job-level twins are fallbacks for old Slurm releases (sbatch(1), srun(1) "OUTPUT ENVIRONMENT").
NUM_TASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
NUM_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
NODELIST = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
# Heterogeneous jobs (sbatch(1)/srun(1) "HETEROGENEOUS JOB SUPPORT"). A het job created by srun
# itself sets only the older PACK spelling of component 0's node list (measured, Slurm 22.05).
HET_SIZE = "SLURM_HET_SIZE"
HET_GROUP_0_NODELIST = ("SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_PACK_GROUP_0")
NODE_NAME = "SLURMD_NODENAME"
# srun(1) --distribution: the node level, then optional socket and core levels, then Pack/NoPack;
# '*' is the default at a level. Slurm writes it back in the same form.
_NODE_LEVEL = r"(?:block|cyclic|arbitrary|plane(?:=\d{1,7})?|unknown|\*)"
_LEVEL = r"(?:block|cyclic|fcyclic|\*)"
DISTRIBUTION = re.compile(rf"{_NODE_LEVEL}(?::{_LEVEL}){{0,2}}(?:,(?:Pack|NoPack))?")
HET_HINT = "start the step with `srun --het-group=0,1 ...` and let srun set the SLURM_* variables"


class SlurmLauncher(Scheduler):
    """Tasks started by ``srun`` in a Slurm job (srun(1), "OUTPUT ENVIRONMENT VARIABLES").

    | variable | fills | required |
    |---|---|---|
    | SLURM_JOB_ID (SLURM_JOBID) | job_id, detection | yes |
    | SLURM_STEP_ID | detection of an srun step (else a batch script or salloc shell) | yes |
    | SLURM_PROCID | rank | in a step |
    | SLURM_STEP_NUM_TASKS (SLURM_NTASKS, SLURM_NPROCS) | world_size | in a step |
    | SLURM_LOCALID | local_rank | in a step |
    | SLURM_NODEID | node_rank | in a step |
    | SLURM_STEP_TASKS_PER_NODE (SLURM_TASKS_PER_NODE) | local_world_size | in a step |
    | SLURM_STEP_NUM_NODES (SLURM_NNODES, SLURM_JOB_NUM_NODES) | num_nodes | in a step |
    | SLURM_STEP_NODELIST (SLURM_NODELIST, SLURM_JOB_NODELIST) | master_addr (first host) | in a step |
    | SLURM_DISTRIBUTION | arbitrary/plane need MASTER_ADDR | no |
    | SLURM_RESTART_COUNT | restart_count (unset on the first run: 0) | no |
    | SLURM_HET_SIZE | a heterogeneous job's step | no |
    | SLURMD_NODENAME | local_world_size in a het step | in a het step |
    | SLURM_JOB_NODELIST_HET_GROUP_0 (SLURM_JOB_NODELIST_PACK_GROUP_0) | master_addr in a het step | in a het step |
    | SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID | requeue: the array element's own id | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    The master (`default_master`) is the step's first host and `scheduler_port` of the job and step;
    inside a batch script 127.0.0.1. In a step of a heterogeneous job (``srun --het-group=0,1``)
    ranks and node indices follow the components while the step's node list and tasks per node
    are in host-name order: the local size is the count at this node's (`SLURMD_NODENAME`)
    position in the list, and the master is the first host of component 0.

    A batch script or salloc shell (no srun step) of a job with more than one task is refused: it
    would be rank 0 of N and wait forever. With one task, or none stated, it is rank 0 of 1.
    """

    name = "slurm"
    how_to_start = (
        "submit it: `sbatch job.sbatch` whose script runs `srun python train.py ...` "
        "(`distenv template` prints ready-made ones), or `srun -N 2 --ntasks-per-node 4 python "
        "train.py ...` (inside salloc or from the login node)"
    )
    variables = (
        Var("SLURM_JOB_ID", "job_id", "yes", "the job id; its presence means a Slurm job"),
        Var("SLURM_JOBID", "job_id", "no", "older spelling of SLURM_JOB_ID"),
        Var("SLURM_STEP_ID", "(detection)", "yes", "set by srun in each task of a job step"),
        Var("SLURM_PROCID", "rank", "in a step", "task rank within the step"),
        Var("SLURM_STEP_NUM_TASKS", "world_size", "in a step", "tasks in the step"),
        Var("SLURM_NTASKS", "world_size", "no", "job-level twin; in a batch script: tasks asked"),
        Var("SLURM_NPROCS", "world_size", "no", "older spelling of SLURM_NTASKS"),
        Var("SLURM_LOCALID", "local_rank", "in a step", "task rank on this node"),
        Var("SLURM_NODEID", "node_rank", "in a step", "index of this node in the step"),
        Var(
            "SLURM_STEP_TASKS_PER_NODE",
            "local_world_size",
            "in a step",
            "tasks per node, compressed: '2(x3),1'",
        ),
        Var("SLURM_TASKS_PER_NODE", "local_world_size", "no", "job-level twin"),
        Var("SLURM_STEP_NUM_NODES", "num_nodes", "in a step", "nodes in the step"),
        Var("SLURM_NNODES", "num_nodes", "no", "job-level twin"),
        Var("SLURM_JOB_NUM_NODES", "num_nodes", "no", "job-level twin"),
        Var("SLURM_STEP_NODELIST", "master_addr", "in a step", "the step's hosts; rank 0 on 1st"),
        Var("SLURM_NODELIST", "master_addr", "no", "job-level twin"),
        Var("SLURM_JOB_NODELIST", "master_addr", "no", "job-level twin"),
        Var(
            "SLURM_DISTRIBUTION",
            "master_addr",
            "no",
            "task distribution; with 'arbitrary' or 'plane' MASTER_ADDR is required",
        ),
        Var(
            "SLURM_RESTART_COUNT",
            "restart_count",
            "no",
            "times the job was requeued; unset on its first run (sbatch(1))",
        ),
        Var(
            HET_SIZE,
            "(het step)",
            "no",
            "components of a heterogeneous job; step lists are then in host-name order",
        ),
        Var(NODE_NAME, "local_world_size", "in a het step", "the node this task runs on"),
        Var(
            HET_GROUP_0_NODELIST[0],
            "master_addr",
            "in a het step",
            "component 0's nodes; rank 0 on its first host",
        ),
        Var(
            HET_GROUP_0_NODELIST[1], "master_addr", "no", "older spelling (set by srun's het jobs)"
        ),
        Var("SLURM_ARRAY_JOB_ID", "(requeue)", "no", "an array's job id (not the element's)"),
        Var("SLURM_ARRAY_TASK_ID", "(requeue)", "no", "this array element's index"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).first(*JOB_ID) is not None

    def _job(self, reader: Reader) -> tuple[str, str] | None:
        """Return ``(variable, job id)``, None outside a job; a job id is a number (squeue(1))."""
        found = reader.first(*JOB_ID)
        if found is not None:
            reader.parse_int(*found, hint="Slurm sets it; never set it by hand", maximum=0xFFFFFFFF)
        return found

    def _step_id(self, reader: Reader) -> int | None:
        """Return the srun step id, or None in a batch script, salloc shell or special step."""
        step = reader.optional_int("SLURM_STEP_ID", maximum=0xFFFFFFFF)
        if step is None or (step > MAX_NORMAL_STEP_ID and step != INTERACTIVE_STEP_ID):
            return None
        return step

    def _het_size(self, reader: Reader) -> int | None:
        """Return the number of components of a heterogeneous job, or None for a plain job."""
        size = reader.optional_int(HET_SIZE, minimum=1)
        return size if size is not None and size > 1 else None

    def _het_rank0_host(
        self, reader: Reader, het_size: int, list_var: str, nodelist: str
    ) -> tuple[str | None, str]:
        """Return rank 0's host in a het job's step and the variable it came from (else why not).

        Ranks follow the components, component 0 first, each in block order; the step's node list
        is in host-name order. Components never share a node (measured), so component 0's nodes in
        the step are those of its job node list that the step lists, and rank 0 runs on the first
        of them. A step may run component 0 on only some of its nodes (`srun -w n4 -N1 -n1 : ...`
        in `salloc -w n3,n4 -N2 -n2 : ...` puts rank 0 on n4, measured). When none is in the step,
        a 2-component job's step is component 1 alone, laid out like a plain step. Otherwise
        returns ``(None, why)``.
        """
        hosts = expand_nodelist(self.name, list_var, nodelist)
        found = reader.first(*HET_GROUP_0_NODELIST)
        if found is not None:
            listed = set(hosts)
            ours = [host for host in expand_nodelist(self.name, *found) if host in listed]
            if ours:
                return ours[0], found[0]
            if het_size == 2:
                return hosts[0], list_var
            why = f"no host of ${found[0]}={shown(found[1])} is in ${list_var}={shown(nodelist)}"
        else:
            why = f"$SLURM_JOB_NODELIST_HET_GROUP_0 is not set (${HET_SIZE}={het_size})"
        return None, (
            f"this step of a heterogeneous job does not run component 0 ({why}), so rank 0's "
            "host is unknown; export MASTER_ADDR (the first host of the step's first component) "
            "before srun, or start the step with `srun --het-group=0,...`"
        )

    def _het_local_size(
        self,
        reader: Reader,
        hosts: list[str],
        list_var: str,
        nodelist: str,
        tpn_var: str,
        tasks: list[int],
    ) -> int:
        """Return this node's task count in a het step: the count at its position in `hosts`."""
        _, node = reader.require(NODE_NAME, hint=HET_HINT)
        if node not in hosts:
            raise InconsistentEnvironmentError(
                self.name,
                f"${NODE_NAME}={shown(node)} is not in ${list_var}={shown(nodelist)}, so this "
                f"node's task count in ${tpn_var} is unknown (heterogeneous job: ${HET_SIZE} is "
                "set)",
                hint=HET_HINT,
                variable=NODE_NAME,
                value=node,
            )
        return tasks[hosts.index(node)]

    def _distribution(self, reader: Reader) -> str:
        """Return the first level of SLURM_DISTRIBUTION (``block``, ``plane=4``...; '' if unset)."""
        value = reader.get("SLURM_DISTRIBUTION")
        if value is None:
            return ""
        if not DISTRIBUTION.fullmatch(value):
            raise InvalidVariableError(
                self.name,
                "SLURM_DISTRIBUTION",
                value,
                "a task distribution such as 'block', 'cyclic:block', 'plane=4' or 'arbitrary' "
                "(srun(1), --distribution)",
                hint="let srun set it from --distribution; never set it by hand",
            )
        return value.split(",")[0].split(":")[0]

    def restart_count(self, env: Mapping[str, str]) -> int:
        return self.reader(env).optional_int("SLURM_RESTART_COUNT") or 0

    def requeue_command(self, env: Mapping[str, str]) -> list[str] | None:
        reader = self.reader(env)
        job = self._job(reader)
        if job is None:
            return None
        # One array element's SLURM_JOB_ID equals SLURM_ARRAY_JOB_ID, and `scontrol requeue`
        # given that id requeues the whole array (measured: its sibling was cancelled "DUE TO JOB
        # REQUEUE"). ARRAY_ID_TASK_ID names the element alone (scontrol(1), "JOB ARRAYS").
        # Ids are numbers (scontrol(1)); anything else would be read as one of its options.
        hint = "Slurm sets it; never set it by hand"
        array = reader.optional_int("SLURM_ARRAY_JOB_ID", hint=hint)
        task = reader.optional_int("SLURM_ARRAY_TASK_ID", hint=hint)
        if array is not None and task is not None:
            return ["scontrol", "requeue", f"{array}_{task}"]
        return ["scontrol", "requeue", job[1].strip()]

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if self._step_id(reader) is None:
            return None
        rank = reader.optional_int("SLURM_PROCID")
        return None if rank is None else (rank, reader.optional_int(*NUM_TASKS, minimum=1))

    def scope(self, env: Mapping[str, str]) -> str:
        reader = self.reader(env)
        job = self._job(reader)
        return scope_tag(self.name, job and job[1], reader.get("SLURM_STEP_ID"))

    def daemon_nodes(self, env: Mapping[str, str]) -> Nodes | None:
        reader = self.reader(env)
        if self._step_id(reader) is None:
            return None
        node = reader.optional_int("SLURM_NODEID")
        step_nodes = reader.optional_int("SLURM_STEP_NUM_NODES", minimum=1)
        job_nodes = reader.optional_int("SLURM_JOB_NUM_NODES", minimum=1)
        # Measured (tests/support/envs/captures): Open MPI's mpirun in a batch script starts its daemons
        # in a step on the *other* nodes only, where SLURM_NODEID restarts at 0. Only a step that
        # spans the whole allocation numbers the nodes as the MPI job sees them.
        if node is None or step_nodes is None or step_nodes != job_nodes or node >= step_nodes:
            return None
        return Nodes(node, step_nodes, "SLURM_NODEID", "SLURM_STEP_NUM_NODES")

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        job = self._job(reader)
        nodelist = reader.first("SLURM_JOB_NODELIST", "SLURM_NODELIST")
        if job is None or nodelist is None:
            return None
        # Ranks of one MPI job see different step ids (mpirun's own node has none), so the port
        # depends on the job alone.
        host = expand_nodelist(self.name, *nodelist)[0]
        return Default(host, scheduler_port(job[1], "mpi"), source=self.name, variable=nodelist[0])

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        job = self._job(reader)
        if job is None:
            return None
        step = self._step_id(reader)
        if step is None:  # a 1-task batch script or salloc shell (a larger one is refused)
            return Default(LOCAL_HOST, scheduler_port(job[1], "batch"), source=self.name)
        port = scheduler_port(job[1], str(step))
        distribution = self._distribution(reader)
        if distribution.startswith(("arbitrary", "plane")):
            # Rank 0 is not known to sit on the first host of the step.
            return Default(
                None,
                port,
                missing=f"with --distribution={distribution} rank 0's host is not the step's "
                "first host; export MASTER_ADDR (rank 0's host name) before srun",
                source=self.name,
            )
        found = reader.first(*NODELIST)
        if found is None:
            return Default(None, port, source=self.name)
        het_size = self._het_size(reader)
        if het_size is not None:
            host, note = self._het_rank0_host(reader, het_size, *found)
            if host is None:  # `note` says why, and the fix
                return Default(None, port, missing=note, source=self.name)
            return Default(host, port, source=self.name, variable=note)
        host = expand_nodelist(self.name, *found)[0]
        return Default(host, port, source=self.name, variable=found[0])

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        found = self._job(reader)
        _, job_id = found or reader.require(*JOB_ID, hint="run inside a Slurm job (srun/sbatch)")
        step = self._step_id(reader)
        if step is None:
            return self._outside_step(reader, job_id)

        rank = reader.integer("SLURM_PROCID", hint=SRUN_HINT)
        world_var, world_size = reader.require(*NUM_TASKS, hint=SRUN_HINT)
        world = reader.parse_int(world_var, world_size, minimum=1)
        local_rank = reader.integer("SLURM_LOCALID", hint=SRUN_HINT)
        node_rank = reader.integer("SLURM_NODEID", hint=SRUN_HINT)
        nodes_var, nodes_text = reader.require(*NUM_NODES, hint=SRUN_HINT)
        num_nodes = reader.parse_int(nodes_var, nodes_text, minimum=1)
        tpn_var, tpn_text = reader.require(*TASKS_PER_NODE, hint=SRUN_HINT)
        tasks_per_node = expand_tasks_per_node(self.name, tpn_var, tpn_text)
        list_var, nodelist = reader.require(*NODELIST, hint=SRUN_HINT)
        hosts = expand_nodelist(self.name, list_var, nodelist)

        if len(tasks_per_node) != num_nodes or sum(tasks_per_node) != world:
            raise InconsistentEnvironmentError(
                self.name,
                f"${tpn_var}={shown(tpn_text)} lists {sum(tasks_per_node)} tasks on "
                f"{len(tasks_per_node)} nodes, but ${world_var}={world_size!r} and "
                f"${nodes_var}={nodes_text!r}",
                hint="do not override SLURM_* variables by hand; let srun set them",
            )
        if len(hosts) != num_nodes:
            raise InconsistentEnvironmentError(
                self.name,
                f"${list_var}={shown(nodelist)} names {len(hosts)} hosts, but "
                f"${nodes_var}={nodes_text!r}",
                hint="do not override SLURM_* variables by hand; let srun set them",
            )
        local_var = tpn_var
        if self._het_size(reader) is not None:
            # Node indices follow the components; the list and the counts, host names.
            local_world_size = self._het_local_size(
                reader, hosts, list_var, nodelist, tpn_var, tasks_per_node
            )
            local_var = NODE_NAME
        else:
            local_world_size = tasks_per_node[node_rank] if node_rank < num_nodes else 0
        return RankInfo.checked(
            self.name,
            {
                "rank": "SLURM_PROCID",
                "world_size": world_var,
                "local_rank": "SLURM_LOCALID",
                "local_world_size": local_var,
                "node_rank": "SLURM_NODEID",
                "num_nodes": nodes_var,
            },
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=None,
            master_port=None,
            job_id=job_id,
            restart_count=self.restart_count(env),
        )

    def _outside_step(self, reader: Reader, job_id: str) -> RankInfo:
        """Batch script or salloc shell: rank 0 of 1 when the job has one task, else refuse."""
        var, value = reader.first("SLURM_NTASKS", "SLURM_NPROCS") or ("SLURM_NTASKS", "")
        ntasks = reader.parse_int(var, value, minimum=1) if value else None
        if ntasks is not None and ntasks > 1:
            raise NotLaunchedError(
                self.name,
                f"this process is job {job_id}'s batch script or salloc shell ($SLURM_STEP_ID is "
                f"not set) but ${var} is {shown(value)}: it would run as rank 0 of {ntasks} and "
                "wait forever for the others",
                hint=SRUN_HINT,
                variable=var,
                value=value,
            )
        warn(
            "slurm: job %s has %s task(s) and this is its batch script or salloc shell; "
            "running as rank 0 of 1",
            job_id,
            ntasks or "no stated",
        )
        return RankInfo.single(
            self.name,
            master_addr=None,
            job_id=job_id,
            restart_count=self.restart_count(reader.env),
        )
