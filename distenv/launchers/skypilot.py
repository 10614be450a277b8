"""The `skypilot` launcher backend: the nodes of a SkyPilot task (``sky launch``, managed jobs).

SkyPilot cannot run on the project's test machines; the tests use environments recorded from its
documentation ("Environment variables for run", docs.skypilot.co/en/stable/running-jobs/
environment-variables.html) and source (skypilot-org/skypilot, ``sky/backends/task_codegen.py``
``RayCodeGen.add_setup``/``_add_ray_task``: ``SKYPILOT_NODE_IPS = '\\n'.join(job_ip_rank_list)``,
``SKYPILOT_NUM_NODES = len(job_ip_rank_list)``, ``SKYPILOT_NODE_RANK`` = this node's index in
that list; ``sky/skylet/constants.py``: ``SKYPILOT_TASK_ID``), and the docs say so. Two
``distenv run`` given those variables on loopback are tested for real.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname
from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, shown
from distenv.launchers.base import Scheduler, World
from distenv.master import MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["SkypilotLauncher"]

RANK, IPS, COUNT, TASK = (
    "SKYPILOT_NODE_RANK",
    "SKYPILOT_NODE_IPS",
    "SKYPILOT_NUM_NODES",
    "SKYPILOT_TASK_ID",
)
HINT = "SkyPilot sets it for the task's run: commands; do not set it yourself"
# One IP a line: the largest cluster SkyPilot provisions lists a few thousand; past this the value
# is corrupt, and it is never split.
MAX_IPS_CHARS = 1_000_000


class SkypilotLauncher(Scheduler):
    """The process SkyPilot's ``run:`` starts on each node of a task, or that node's agent.

    | variable | fills | required |
    |---|---|---|
    | SKYPILOT_NODE_RANK | rank, node_rank (one process per node) | yes |
    | SKYPILOT_NODE_IPS | num_nodes (checked), master_addr (its first line) | yes |
    | SKYPILOT_NUM_NODES | num_nodes (checked against the IPs), detection | yes |
    | SKYPILOT_TASK_ID | job_id, master_port, scope | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    SkyPilot runs the task's ``run:`` commands once on every node: a training script started
    there is rank SKYPILOT_NODE_RANK of SKYPILOT_NUM_NODES, and ``distenv run -n K`` there starts
    K ranks per node of one job. The master is the first IP (node rank 0's, as SkyPilot orders
    the list); the port is derived from SKYPILOT_TASK_ID, alike on every node. torchrun or
    mpirun started in ``run:`` wins (their ranks carry their own variables).
    """

    name = "skypilot"
    aliases = ("sky",)
    how_to_start = (
        "launch a SkyPilot task whose run: section starts `distenv run --nproc-per-node "
        "$SKYPILOT_NUM_GPUS_PER_NODE train.py`"
    )
    variables = (
        Var(RANK, "node_rank", "yes", "this node's index, 0 to num_nodes-1"),
        Var(IPS, "master_addr", "yes", "the nodes' IPs, one a line, in node-rank order"),
        Var(COUNT, "num_nodes", "yes", "the task's nodes (the number of lines of the IPs)"),
        Var(
            TASK,
            "job_id",
            "no",
            "sky-<timestamp>_<cluster>_<id>; kept across managed-job recoveries",
        ),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        return any(reader.has(name) for name in (RANK, COUNT, IPS))

    def _ips(self, reader: Reader) -> list[str]:
        """Return SKYPILOT_NODE_IPS's addresses, one a line, distinct, each a host address."""
        _, text = reader.require(IPS, hint=HINT)
        expected = "one IP address a line, e.g. '10.0.0.4\\n10.0.0.5'"
        if len(text) > MAX_IPS_CHARS:
            raise InvalidVariableError(
                self.name, IPS, text, f"{expected}, at most {MAX_IPS_CHARS} characters"
            )
        lines = text.strip().split("\n")
        if any(not line.strip() for line in lines):
            raise InvalidVariableError(
                self.name, IPS, text, f"{expected}, no empty line", hint=HINT
            )
        ips = [check_hostname(self.name, IPS, line.strip(), hint=HINT) for line in lines]
        if len(set(ips)) != len(ips):
            raise InvalidVariableError(self.name, IPS, text, "distinct IP addresses", hint=HINT)
        return ips

    def _nodes(self, reader: Reader) -> tuple[int, int, list[str]]:
        """Return ``(node_rank, num_nodes, ips)``, with the three variables cross-checked."""
        count = reader.integer(COUNT, hint=HINT, minimum=1)
        node = reader.integer(RANK, hint=HINT)
        ips = self._ips(reader)
        if len(ips) != count:
            raise InconsistentEnvironmentError(
                self.name,
                f"${COUNT}={count} but ${IPS} lists {len(ips)} address(es) "
                f"({shown(reader.get(IPS) or '')})",
                hint="SkyPilot sets both from the task's nodes; unset any copy of them set in "
                "the task's envs:",
                variable=COUNT,
                value=str(count),
            )
        if node >= count:
            raise InconsistentEnvironmentError(
                self.name,
                f"${RANK}={node} is not below ${COUNT}={count}",
                hint="SkyPilot numbers the nodes 0 to num_nodes-1; unset any copy of it set in "
                "the task's envs:",
                variable=RANK,
                value=str(node),
            )
        return node, count, ips

    def _port(self, reader: Reader) -> int:
        return scheduler_port(reader.get(TASK) or "0", "0")

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not reader.has(RANK):
            return None
        node, count, _ = self._nodes(reader)
        return node, count

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get(TASK), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        node, count, _ = self._nodes(reader)
        return RankInfo.one_per_node(
            self.name, {"rank": RANK, "world_size": COUNT}, node, count, job_id=reader.get(TASK)
        )

    def _first(self, reader: Reader) -> Default | None:
        if not reader.has(IPS):
            return None
        return Default(self._ips(reader)[0], self._port(reader), source=self.name, variable=IPS)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        return self._first(self.reader(env))

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        # mpirun started on node 0 over SKYPILOT_NODE_IPS (SkyPilot's MPI example): the first IP.
        return self._first(self.reader(env))
