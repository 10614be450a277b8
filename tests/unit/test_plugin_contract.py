"""Every hook docs/plugins.md offers works for a plug-in written against that page alone.

The two plug-ins below import only what the page's contract table lists and override every hook
it names: `Launcher`'s ``world``, ``scope``, ``default_master``, ``restart_count``, ``node_agent``
and ``processes_per_node``; `Scheduler`'s ``daemon_nodes``, ``allocation_master`` and
``requeue_command``. They are found the way an installed plug-in is, through an entry point of
`PLUGIN_GROUP`, so a change to the contract that breaks an existing plug-in fails here.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

import pytest

import distenv
from distenv import RankInfo
from distenv.errors import NotLaunchedError
from distenv.launchers import (
    MASTER_VARS,
    PLUGIN_GROUP,
    Default,
    Launcher,
    Nodes,
    Scheduler,
    Var,
    World,
    scheduler_port,
    scope_tag,
)


class SiteLauncher(Launcher):
    """A site's launcher that starts the ranks itself, like torchrun.

    | variable | fills | required |
    |---|---|---|
    | SITE_RANK | rank | yes |
    | SITE_SIZE | world_size | yes |
    | SITE_JOB | job_id | no |
    | SITE_RESTARTS | restart_count | no |
    | SITE_NODE, SITE_NODES | node_rank, num_nodes (a node agent) | no |
    | SITE_PER_NODE | processes per node the job states | no |
    """

    name = "sitelaunch"
    variables = (
        Var("SITE_RANK", "rank", "yes", "this process's rank"),
        Var("SITE_SIZE", "world_size", "yes", "the number of ranks"),
        Var("SITE_JOB", "job_id", "no", "the job id"),
        Var("SITE_RESTARTS", "restart_count", "no", "restarts so far"),
        Var("SITE_NODE", "node_rank", "no", "this node's index, for a node agent"),
        Var("SITE_NODES", "num_nodes", "no", "the number of nodes, for a node agent"),
        Var("SITE_PER_NODE", "local_world_size", "no", "ranks each node runs"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("SITE_SIZE")

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        if not reader.has("SITE_RANK"):
            raise NotLaunchedError(
                self.name, "this process is a node's agent, no rank", hint="start the ranks"
            )
        return RankInfo(
            launcher=self.name,
            rank=reader.integer("SITE_RANK"),
            world_size=reader.integer("SITE_SIZE", minimum=1),
            local_rank=reader.integer("SITE_RANK"),
            local_world_size=None,
            node_rank=None,
            num_nodes=None,
            master_addr=None,
            master_port=None,
            job_id=reader.get("SITE_JOB"),
            restart_count=self.restart_count(env),
        )

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not reader.has("SITE_RANK"):
            return None
        return reader.integer("SITE_RANK"), reader.integer("SITE_SIZE", minimum=1)

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("SITE_JOB"), None)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        return Default("sitehost", scheduler_port(self.reader(env).get("SITE_JOB") or "0"))

    def restart_count(self, env: Mapping[str, str]) -> int:
        text = self.reader(env).get("SITE_RESTARTS")
        return 0 if text is None else int(text)

    def node_agent(self, env: Mapping[str, str]) -> RankInfo | None:
        reader = self.reader(env)
        if not reader.has("SITE_NODES"):
            return None
        node, nodes = reader.integer("SITE_NODE"), reader.integer("SITE_NODES", minimum=1)
        return RankInfo(
            launcher=self.name,
            rank=node,
            world_size=nodes,
            local_rank=0,
            local_world_size=1,
            node_rank=node,
            num_nodes=nodes,
            master_addr="sitehost",
            master_port=4711,
        )

    def processes_per_node(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        value = self.reader(env).get("SITE_PER_NODE")
        return None if value is None else ("SITE_PER_NODE", value)


class SiteScheduler(Scheduler):
    """A site's scheduler: grants nodes, runs one task per node, encloses MPI jobs.

    | variable | fills | required |
    |---|---|---|
    | GRID_JOB | job_id, detection | yes |
    | GRID_TASK, GRID_TASKS | rank, world_size (one task per node) | no |
    | GRID_HEAD | the allocation's first host | no |
    """

    name = "sitegrid"
    variables = (
        Var("GRID_JOB", "job_id", "yes", "the job id; its presence means the scheduler"),
        Var("GRID_TASK", "rank", "no", "this task's index, one task per node"),
        Var("GRID_TASKS", "world_size", "no", "the number of tasks"),
        Var("GRID_HEAD", "master_addr", "no", "the allocation's first host"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("GRID_JOB")

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not reader.has("GRID_TASK"):
            return None
        return reader.integer("GRID_TASK"), reader.integer("GRID_TASKS", minimum=1)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        job = reader.require("GRID_JOB")[1]
        task, tasks = reader.integer("GRID_TASK"), reader.integer("GRID_TASKS", minimum=1)
        return RankInfo(
            launcher=self.name,
            rank=task,
            world_size=tasks,
            local_rank=0,
            local_world_size=1,
            node_rank=task,
            num_nodes=tasks,
            master_addr=None,
            master_port=None,
            job_id=job,
        )

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("GRID_JOB"), None)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        head, job = reader.get("GRID_HEAD"), reader.get("GRID_JOB")
        return None if job is None else Default(head, scheduler_port(job, "task"))

    def daemon_nodes(self, env: Mapping[str, str]) -> Nodes | None:
        reader = self.reader(env)
        if not reader.has("GRID_TASK"):
            return None
        return Nodes(
            reader.integer("GRID_TASK"), reader.integer("GRID_TASKS"), "GRID_TASK", "GRID_TASKS"
        )

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        head, job = reader.get("GRID_HEAD"), reader.get("GRID_JOB")
        if head is None or job is None:
            return None
        return Default(head, scheduler_port(job, "mpi"), source=self.name)

    def requeue_command(self, env: Mapping[str, str]) -> list[str] | None:
        job = self.reader(env).get("GRID_JOB")
        return None if job is None else ["gridctl", "requeue", job]


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both plug-ins, found through entry points as if their distribution were installed."""
    found = metadata.EntryPoints(
        metadata.EntryPoint(name, f"{__name__}:{cls}", PLUGIN_GROUP)
        for name, cls in (("sitelaunch", "SiteLauncher"), ("sitegrid", "SiteScheduler"))
    )
    real = metadata.entry_points

    def entry_points(**select: str) -> metadata.EntryPoints:
        if select.get("group") == PLUGIN_GROUP:
            return found.select(**select)
        return real(**select)

    monkeypatch.setattr(metadata, "entry_points", entry_points)


HYDRA_RANK5_OF_8 = {
    "PMI_RANK": "5",
    "PMI_SIZE": "8",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "4",
}


def test_a_launcher_plugin_answers_with_its_hooks() -> None:
    """rank_info, scope, default_master and restart_count make the answer of an opted-in plug-in."""
    env = {"DISTENV_PLUGINS": "sitelaunch", "SITE_RANK": "2", "SITE_SIZE": "4"}
    detection = distenv.explain("auto", {**env, "SITE_JOB": "77", "SITE_RESTARTS": "3"})
    assert detection.launcher.name == "sitelaunch"
    assert (detection.info.rank, detection.info.world_size) == (2, 4)
    assert detection.info.restart_count == 3
    assert (detection.info.master_addr, detection.info.master_port) == (
        "sitehost",
        scheduler_port("77"),
    )
    assert detection.scope == "sitelaunch/77/-"


def test_a_launcher_plugin_world_refuses_leftover_torchrun_variables() -> None:
    """`world` numbers the step: torchrun's RANK/WORLD_SIZE that contradict it are refused."""
    env = {"DISTENV_PLUGINS": "sitelaunch", "SITE_RANK": "2", "SITE_SIZE": "4"}
    with pytest.raises(distenv.DistEnvError, match="contradict sitelaunch"):
        distenv.explain("auto", {**env, "RANK": "0", "WORLD_SIZE": "8"})


def test_a_node_agent_and_its_processes_per_node() -> None:
    """node_agent answers for `distenv run` where rank_info refuses; processes_per_node is checked."""
    from distenv.local.plan import check_processes_per_node, scheduler_layout

    env = {
        "DISTENV_PLUGINS": "sitelaunch",
        "SITE_SIZE": "8",
        "SITE_NODE": "1",
        "SITE_NODES": "2",
        "SITE_PER_NODE": "4",
    }
    layout = scheduler_layout("run", env)
    assert layout is not None
    assert (layout.info.node_rank, layout.info.num_nodes) == (1, 2)
    assert layout.scope == "sitelaunch/-/-"
    check_processes_per_node("run", layout, env, 4)
    with pytest.raises(distenv.DistEnvError, match=r"SITE_PER_NODE='4'"):
        check_processes_per_node("run", layout, env, 2)


def test_mpi_inside_a_scheduler_plugin_uses_its_nodes_and_allocation_master() -> None:
    """MPI ranks started by one daemon per node take daemon_nodes and allocation_master."""
    env = {
        **HYDRA_RANK5_OF_8,
        "DISTENV_PLUGINS": "sitegrid",
        "GRID_JOB": "9",
        "GRID_TASK": "1",
        "GRID_TASKS": "2",
        "GRID_HEAD": "g1",
    }
    detection = distenv.explain("auto", env)
    assert detection.launcher.name == "mpi"
    assert (detection.info.rank, detection.info.world_size) == (5, 8)
    assert (detection.info.node_rank, detection.info.num_nodes) == (1, 2)
    assert (detection.info.master_addr, detection.info.master_port) == (
        "g1",
        scheduler_port("9", "mpi"),
    )
    assert ("sitegrid", "master taken from its allocation: g1") in detection.considered


def test_mpi_ranks_that_are_the_scheduler_plugins_tasks_take_its_layout() -> None:
    """Where the scheduler's `world` agrees with MPI's, its layout and default master are used."""
    env = {
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "MPI_LOCALRANKID": "0",
        "MPI_LOCALNRANKS": "1",
        "DISTENV_PLUGINS": "sitegrid",
        "GRID_JOB": "9",
        "GRID_TASK": "1",
        "GRID_TASKS": "2",
        "GRID_HEAD": "g1",
    }
    detection = distenv.explain("auto", env)
    assert detection.launcher.name == "sitegrid"
    assert (detection.info.node_rank, detection.info.num_nodes) == (1, 2)
    assert (detection.info.master_addr, detection.info.master_port) == (
        "g1",
        scheduler_port("9", "task"),
    )


def test_a_scheduler_plugin_requeues_its_job() -> None:
    """requeue_command is what `distenv.requeue()` runs inside the plug-in's job."""
    from distenv.preempt import requeue_command

    env = {"DISTENV_PLUGINS": "sitegrid", "GRID_JOB": "9", "GRID_TASK": "0", "GRID_TASKS": "1"}
    assert requeue_command(env) == ["gridctl", "requeue", "9"]
