"""The `indexed-job` launcher backend: pods of a Kubernetes Indexed Job (and so of a JobSet).

Kubernetes cannot run on the project's test machines; the tests use environments recorded from
Kubernetes' documentation ("Jobs", completion mode Indexed: JOB_COMPLETION_INDEX) and JobSet's
PyTorch example (kubernetes-sigs/jobset v0.12.0, site/static/examples/pytorch/cnn-mnist/mnist.yaml:
MASTER_ADDR, MASTER_PORT and RANK set by the user, the node count on torchrun's command line).
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv.errors import NotLaunchedError
from distenv.launchers.base import Scheduler
from distenv.master import DEFAULT_PORT, MASTER_VARS, Default, explicit_master, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Var

__all__ = ["IndexedJobLauncher"]

INDEX = "JOB_COMPLETION_INDEX"
START_HINT = (
    "make the container's command `distenv run --nnodes N --node-rank $JOB_COMPLETION_INDEX "
    "--master-addr $MASTER_ADDR --run-id NAME -n P train.py` (or torchrun with the same options), "
    "or, for one process per pod, set WORLD_SIZE to the number of pods"
)


class IndexedJobLauncher(Scheduler):
    """One process per pod of an Indexed Job, numbered by its completion index.

    | variable | fills | required |
    |---|---|---|
    | JOB_COMPLETION_INDEX | rank, node_rank, detection | yes |
    | WORLD_SIZE | world_size, num_nodes: the pods, set by you | yes |
    | MASTER_ADDR, MASTER_PORT | master: pod 0's name, set by you (needed: nothing else names it) | no |
    | DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Kubernetes numbers the pods but says neither how many there are nor where pod 0 is: a JobSet
    or Job template sets MASTER_ADDR (e.g. ``<jobset>-<job>-0-0.<jobset>``) itself. A process
    started directly is rank JOB_COMPLETION_INDEX of WORLD_SIZE; without WORLD_SIZE it is refused.
    """

    name = "indexed-job"
    aliases = ("jobset",)
    how_to_start = "run it as the command of an Indexed Job's (or a JobSet's) pods"
    variables = (
        Var(INDEX, "node_rank", "yes", "the pod's completion index (a node index)"),
        Var("WORLD_SIZE", "world_size", "yes", "the number of pods, set in the pod template"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has(INDEX)

    def scope(self, env: Mapping[str, str]) -> str:
        # No Kubernetes variable names the job; pod 0's address, set for the whole job, does.
        return scope_tag(self.name, self.reader(env).get("MASTER_ADDR"), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        index = reader.integer(INDEX)
        if not reader.has("WORLD_SIZE"):
            raise NotLaunchedError(
                self.name,
                f"this process is pod {index} of an Indexed Job (${INDEX}={index}), which numbers "
                "pods, not processes, and no variable says how many pods there are",
                hint=START_HINT,
                variable="WORLD_SIZE",
            )
        world = reader.integer("WORLD_SIZE", minimum=1)
        return RankInfo.one_per_node(
            self.name,
            {"rank": INDEX, "world_size": "WORLD_SIZE", "node_rank": INDEX},
            index,
            world,
            job_id=explicit_master(reader)[0],
        )

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        # torchrun's default port when only MASTER_ADDR is set.
        return Default(
            None,
            DEFAULT_PORT,
            missing="an Indexed Job does not say where pod 0 is: set MASTER_ADDR (pod 0's "
            "host name, e.g. <jobset>-<job>-0-0.<jobset>) and MASTER_PORT in the pod template",
            source=self.name,
        )

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None
