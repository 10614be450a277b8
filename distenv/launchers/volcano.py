"""The `volcano` launcher backend: pods of a Volcano Job (batch.volcano.sh).

Volcano cannot run on the project's test machines; the tests use environments recorded from its
source (volcano-sh/volcano v1.15.1: pkg/controllers/job/plugins/env/env.go sets VC_TASK_INDEX,
svc/svc.go sets VC_<TASK>_HOSTS and VC_<TASK>_NUM for every task,
distributed-framework/pytorch/pytorch.go sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK).
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import MAX_HOSTS, check_hostname
from distenv.errors import InvalidVariableError, NotLaunchedError
from distenv.launchers.base import Scheduler
from distenv.master import Default
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["VolcanoLauncher"]

INDEX = "VC_TASK_INDEX"
# The host lists of the pytorch plugin's default tasks ("master", "worker"); other task names make
# other variables, which no declaration can name in advance.
HOST_LISTS = ("VC_MASTER_HOSTS", "VC_WORKER_HOSTS")
START_HINT = (
    "enable Volcano's pytorch plugin (`plugins: {pytorch: [--master=master --worker=worker "
    "--port=23456]}`), which sets RANK, WORLD_SIZE and MASTER_ADDR for one process per pod, or "
    "start `distenv run --nnodes N --node-rank K --master-addr <master pod> --run-id NAME` with "
    "K counted across the tasks (master first)"
)


class VolcanoLauncher(Scheduler):
    """A Volcano Job's pod: it numbers pods within each task, so it states no rank itself.

    | variable | fills | required |
    |---|---|---|
    | VC_TASK_INDEX | detection; the pod's index *within its task* | yes |
    | VC_MASTER_HOSTS, VC_WORKER_HOSTS | pods of the pytorch plugin's default tasks: one pod is a single process | no |

    ``master-0`` and ``worker-0`` both have VC_TASK_INDEX 0 and nothing says which task a pod
    belongs to, so a process started directly in a job of several pods (an index above 0, or
    the default tasks' host lists naming more than one pod) is refused unless a launcher
    numbered it: the pytorch plugin's RANK/WORLD_SIZE/MASTER_* (the `pytorch` backend answers,
    one process per pod), torchrun, ``distenv run`` or MPI.
    """

    name = "volcano"
    how_to_start = "run it in a Volcano Job with the pytorch plugin (or under torchrun)"
    variables = (
        Var(INDEX, "(detection)", "yes", "the pod's index within its task (VK_TASK_INDEX too)"),
        Var(
            "VC_MASTER_HOSTS", "(message)", "no", "svc plugin: task 'master's pods, comma-separated"
        ),
        Var(
            "VC_WORKER_HOSTS", "(message)", "no", "svc plugin: task 'worker's pods, comma-separated"
        ),
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has(INDEX)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        index = reader.integer(INDEX, hint=START_HINT)
        tasks = [name for name in HOST_LISTS if reader.has(name)]
        pods = sum(len(self._pods(reader, name)) for name in tasks)
        if index == 0 and pods <= 1:
            # A one-pod job (as far as the default tasks' lists show): a single process.
            return RankInfo.single(self.name)
        seen = f" ({', '.join(tasks)} list {pods} pods)" if tasks else ""
        raise NotLaunchedError(
            self.name,
            f"${INDEX} is '{index}', this pod's index within its task: every task counts from "
            f"0 (master-0 and worker-0 are both 0) and no variable says which task this is{seen}, "
            "so it is no rank",
            hint=START_HINT,
            variable=INDEX,
            value=str(index),
        )

    def _pods(self, reader: Reader, name: str) -> list[str]:
        """Return the pods of one task's host list (svc.go joins their host names with ',')."""
        value = reader.get(name) or ""
        pods = value.split(",")
        if len(pods) > MAX_HOSTS or not all(pods):
            raise InvalidVariableError(
                self.name,
                name,
                value,
                f"a comma-separated list of at most {MAX_HOSTS} pod host names, none empty",
                hint="Volcano's svc plugin sets it; do not set it yourself",
            )
        return [check_hostname(self.name, name, pod) for pod in pods]

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None
