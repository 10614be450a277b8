"""The `htcondor` launcher backend: the nodes of an HTCondor parallel-universe job.

HTCondor cannot be run on the project's test machines; the tests use environments recorded from
its sources and manual (htcondor/htcondor 7491a14: ``src/condor_starter.V6.1/parallel_proc.cpp``
``addEnvVars``, ``src/condor_shadow.V6.1/parallelshadow.cpp``,
``src/condor_schedd.V6/dedicated_scheduler.cpp``, ``src/condor_utils/spooled_job_files.cpp``,
``src/condor_examples/openmpiscript``, ``docs/users-manual/env-of-job.rst`` "Parallel Jobs"), and
the docs say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distenv.errors import InvalidVariableError
from distenv.launchers.base import Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["HtcondorLauncher"]

CONDOR_SETS = "HTCondor's starter sets it on every node of a parallel-universe job"
# gen_ckpt_name (spooled_job_files.cpp): SPOOL/<cluster % 10000>/<proc % 10000>/
# cluster<C>.proc<P>.subproc<S>; the shadow hands every node proc 0's (parallelshadow.cpp).
SPOOL_NAME = r"cluster([0-9]{1,10})\.proc[0-9]{1,10}\.subproc[0-9]{1,10}"
MASTER_FIX = (
    "HTCondor puts no node's address in the environment, so node 0 cannot be found by the "
    "others: pin node 0 to one machine in the submit description (its own `requirements = "
    '(Machine == "gpu01.example.edu")` and `machine_count = 1` before the first `queue`) and '
    'set `environment = "MASTER_ADDR=gpu01.example.edu"` for every node (or run `distenv run '
    "--master-addr gpu01.example.edu ...` on every node); or start the ranks "
    "with HTCondor's openmpiscript (`executable = openmpiscript`, mpirun inside), whose ranks "
    "exchange the master over MPI (docs/start/htcondor.md)"
)


class HtcondorLauncher(Scheduler):
    """The process HTCondor's parallel universe starts on each node (``universe = parallel``).

    | variable | fills | required |
    |---|---|---|
    | _CONDOR_PROCNO | rank, node_rank: this node's ``$(Node)``; detection | yes |
    | _CONDOR_NPROCS | world_size, num_nodes: the job's machines, all procs; detection | yes |
    | _CONDOR_REMOTE_SPOOL_DIR | job_id (its cluster id), scope, master_port | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master (MASTER_ADDR: needed on several nodes) | no |

    The starter runs the executable once per claimed machine with ``_CONDOR_PROCNO`` (the node
    index, 0 to N-1 across every ``queue`` of the job) and ``_CONDOR_NPROCS`` (CurrentHosts, the
    job's machines): rank = node index, world size = nodes, one process per node, or one
    ``distenv run`` per node starting its ranks. No variable names node 0's address (the
    parallel universe's own MPI scripts pass contact files through ``condor_chirp``, which
    distenv, reading the environment only, does not run), so on more than one node the master
    is the user's ``MASTER_ADDR``, else the process is refused with the way to give it.

    Open MPI's ranks started by HTCondor's openmpiscript are the `mpi` launcher's: this layer
    states no rank (`world` is None: an orted inherits its node's ``_CONDOR_PROCNO``, not a
    rank) and no master, so rank 0 sends its own over MPI.
    """

    name = "htcondor"
    how_to_start = (
        "submit it: `condor_submit job.sub` with `universe = parallel` and `machine_count = N`, "
        "whose executable runs `distenv run --nproc-per-node G train.py` on each node"
    )
    variables = (
        Var("_CONDOR_PROCNO", "rank", "yes", "this node's index, $(Node): 0 to N-1"),
        Var("_CONDOR_NPROCS", "world_size", "yes", "the job's machines (CurrentHosts)"),
        Var(
            "_CONDOR_REMOTE_SPOOL_DIR",
            "job_id",
            "no",
            "proc 0's spool dir, '.../cluster<ID>.proc0.subproc0': the cluster id",
        ),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self._detected(self.reader(env))

    def _detected(self, reader: Reader) -> bool:
        # Also asked by `default_master`: detection asks each public hook once (detection.layer).
        return reader.has("_CONDOR_PROCNO") or reader.has("_CONDOR_NPROCS")

    def world(self, env: Mapping[str, str]) -> World | None:
        return None  # an MPI rank's _CONDOR_PROCNO is its node's, never its rank

    def _cluster(self, reader: Reader) -> str | None:
        """Return the job's cluster id from _CONDOR_REMOTE_SPOOL_DIR's name, None if unset."""
        spool = reader.get("_CONDOR_REMOTE_SPOOL_DIR")
        if spool is None:
            return None
        match = re.fullmatch(SPOOL_NAME, spool.rstrip("/").rsplit("/", 1)[-1])
        if match is None:
            raise InvalidVariableError(
                self.name,
                "_CONDOR_REMOTE_SPOOL_DIR",
                spool,
                "the job's spool directory, ending in 'cluster<ID>.proc<P>.subproc<S>'",
                hint=CONDOR_SETS + "; never set it by hand",
            )
        return match.group(1)

    def _layout(self, reader: Reader) -> tuple[int, int]:
        hint = CONDOR_SETS + " (universe = parallel); never set it by hand"
        node = reader.integer("_CONDOR_PROCNO", hint=hint)
        nodes = reader.integer("_CONDOR_NPROCS", hint=hint, minimum=1)
        return node, nodes

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self._cluster(self.reader(env)), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        node, nodes = self._layout(reader)
        return RankInfo.one_per_node(
            self.name,
            {"rank": "_CONDOR_PROCNO", "world_size": "_CONDOR_NPROCS"},
            node,
            nodes,
            job_id=self._cluster(reader),
        )

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not self._detected(reader):
            return None
        node, nodes = self._layout(reader)
        port = scheduler_port(self._cluster(reader) or "0", "parallel")
        if nodes == 1:
            return Default(LOCAL_HOST, port, source=self.name)
        return Default(
            None,
            port,
            missing=f"node {node} of {nodes} of an HTCondor parallel-universe job "
            f"($_CONDOR_PROCNO={node}, $_CONDOR_NPROCS={nodes}) has no master address: "
            + MASTER_FIX,
            source=self.name,
        )

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None  # no address: MPI ranks inside the job exchange it over MPI
