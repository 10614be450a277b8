"""A task whose environment a container stripped is refused, never run as rank 0 of 1.

The process trees are recorded: each is a /proc written from what ``ps -o pid,ppid,comm,args``
showed above a task (Slurm, Open MPI and MPICH on the test clusters; PALS, LSF and Flux from their
documentation), and `locate` is pointed at it with ``proc=``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from distenv.detection.choice import choose
from distenv.detection.pipeline import locate, origin
from distenv.detection.starters import Origin, started_by
from distenv.errors import LauncherNotFoundError, StrippedEnvironmentError
from distenv.system.containers import container, shm_bytes
from distenv.system.processes import Ancestor, ancestors, cgroup
from tests.support.envs.slurm import SRUN_2N_4T

# pid -> (comm, ppid, argv); "self" is the process that detects.
Tree = Mapping[int | str, tuple[str, int, str]]

# srun -N2 -n4 ch-run ... python (multi cluster, measured): ch-run execs python, whose parent is
# the step's slurmstepd, daemonised under init.
SRUN_STEP: Tree = {
    "self": ("python", 22140, ""),
    22140: ("slurmstepd", 1, "slurmstepd: [500038.0]"),
    1: ("init", 0, "/sbin/init"),
}
# sbatch --wrap "python ...": the batch script's shell, then the batch step's slurmstepd.
SBATCH_SCRIPT: Tree = {
    "self": ("python", 300, ""),
    300: ("slurm_script", 299, "/bin/sh /var/spool/slurmd/job500014/slurm_script"),
    299: ("slurmstepd", 1, "slurmstepd: [500014.batch]"),
    1: ("init", 0, "/sbin/init"),
}
# A wrapper shell between the daemon and the task: apptainer exec --cleanenv from a script.
WRAPPED = {
    "self": ("python", 41, ""),
    41: ("starter", 40, "Apptainer runtime parent"),
    40: ("bash", 39, "bash wrapper.sh"),
}


def daemon(name: str) -> Tree:
    """A task two generations below the launcher daemon `name` (a wrapper shell between)."""
    return {**WRAPPED, 39: (name, 1, name), 1: ("init", 0, "/sbin/init")}


def write_tree(root: Path, tree: Tree, cgroup_text: str = "0::/\n") -> str:
    """Write `tree` as a /proc under `root` and return its path."""
    for pid, (comm, ppid, argv) in tree.items():
        entry = root / str(pid)
        entry.mkdir(parents=True)
        number = 999 if pid == "self" else pid
        (entry / "stat").write_bytes(f"{number} ({comm}) S {ppid} {number} 0 0".encode())
        (entry / "cmdline").write_bytes(argv.replace(" ", "\0").encode() + b"\0")
    (root / "self" / "cgroup").write_text(cgroup_text)
    return str(root)


def test_the_ancestry_is_read_from_the_tree_given(tmp_path: Path) -> None:
    """Parent first, up to init; the command line only of the names asked for."""
    proc = write_tree(tmp_path, SBATCH_SCRIPT)
    assert ancestors(proc, commands_of=frozenset({"slurmstepd"})) == [
        Ancestor(300, "slurm_script"),
        Ancestor(299, "slurmstepd", "slurmstepd: [500014.batch]"),
        Ancestor(1, "init"),
    ]
    assert ancestors(proc, limit=1) == [Ancestor(300, "slurm_script")]
    assert ancestors(str(tmp_path / "missing")) == []
    assert cgroup(str(tmp_path / "missing")) == ""


def test_a_pid_namespace_ends_the_walk(tmp_path: Path) -> None:
    """A container with its own pid namespace: its init has parent 0, above it nothing is seen."""
    proc = write_tree(tmp_path, {"self": ("python", 1, ""), 1: ("conmon-init", 0, "")})
    assert ancestors(proc) == [Ancestor(1, "conmon-init")]


@pytest.mark.parametrize(
    ("name", "launcher"),
    [
        ("slurmstepd", "slurm"),
        ("orted", "mpi"),
        ("prted", "mpi"),
        ("mpirun.openmpi", "mpi"),
        ("prterun", "mpi"),
        ("hydra_pmi_proxy", "mpi"),
        ("pmi_proxy", "mpi"),
        ("palsd", "pbs"),
        ("res", "lsf"),
        ("flux-broker-0", "flux"),
        ("flux-broker", "flux"),
    ],
)
def test_every_launch_daemon_names_its_launcher(tmp_path: Path, name: str, launcher: str) -> None:
    """Below any launcher's per-node daemon, with none of its variables: refused on every task,
    naming the daemon, its pid, the stripping flags and --launcher none."""
    proc = write_tree(tmp_path, daemon(name))
    with pytest.raises(StrippedEnvironmentError) as caught:
        locate("auto", {"PATH": "/usr/bin"}, runtime=False, proc=proc, root=proc)
    error = caught.value
    assert error.source == launcher
    message = str(error)
    assert f"started by {name} (pid 39" in message
    assert "--cleanenv" in message
    assert "--unset-env" in message
    assert "-e NAME" in message
    assert "APPTAINERENV_" in message
    assert "--launcher none" in message


def test_an_array_element_task_is_refused_naming_its_step(tmp_path: Path) -> None:
    """slurmstepd of an array element's task step: `[500014_3.0]` is a task step, refused."""
    proc = write_tree(tmp_path, {**SRUN_STEP, 22140: ("slurmstepd", 1, "slurmstepd: [500014_3.0]")})
    with pytest.raises(StrippedEnvironmentError, match=r"\(pid 22140, step 500014_3\.0\)"):
        locate("auto", {}, runtime=False, proc=proc)


def test_the_container_found_names_its_own_flag_and_fix(tmp_path: Path) -> None:
    """Inside charliecloud ($CH_RUNNING survives --unset-env): its flag and fix only."""
    proc = write_tree(tmp_path, SRUN_STEP)
    with pytest.raises(StrippedEnvironmentError) as caught:
        locate("auto", {"CH_RUNNING": "Weird Al Yankovic"}, runtime=False, proc=proc)
    message = str(caught.value)
    assert "slurmstepd (pid 22140, step 500038.0)" in message
    assert "charliecloud ($CH_RUNNING is set)" in message
    assert "`ch-run --unset-env`" in message
    assert "--cleanenv" not in message
    assert caught.value.variable == "SLURM_JOB_ID"


@pytest.mark.parametrize(
    "line",
    [
        "4:memory:/slurm/uid_0/job_5/step_0/task_1",  # cgroup v1
        "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_1",  # cgroup v2
    ],
)
def test_a_slurm_step_cgroup_names_the_step_where_the_tree_does_not(
    tmp_path: Path, line: str
) -> None:
    """Own pid namespace (apptainer --containall, podman): the cgroup still names the step."""
    proc = write_tree(tmp_path, {"self": ("python", 1, ""), 1: ("sh", 0, "")}, f"1:cpu:/\n{line}\n")
    with pytest.raises(StrippedEnvironmentError, match=r"Slurm step 5\.0 \(cgroup '"):
        locate("auto", {}, runtime=False, proc=proc)


@pytest.mark.parametrize("step", ["batch", "extern", "interactive"])
@pytest.mark.parametrize("job", ["500014", "500014_3"], ids=["job", "array-element"])
def test_single_process_steps_run_alone(tmp_path: Path, step: str, job: str) -> None:
    """A batch script (or an extern/interactive step) is one process by design: rank 0 of 1."""
    tree = {**SBATCH_SCRIPT, 299: ("slurmstepd", 1, f"slurmstepd: [{job}.{step}]")}
    info = locate("auto", {}, runtime=False, proc=write_tree(tmp_path / "tree", tree)).info
    assert (info.launcher, info.world_size) == ("none", 1)
    cgroup_proc = write_tree(
        tmp_path / "cgroup", {"self": ("python", 0, "")}, f"0::/job_5/step_{step}\n"
    )
    assert locate("auto", {}, runtime=False, proc=cgroup_proc).info.world_size == 1


def test_launcher_none_runs_alone_on_purpose(tmp_path: Path) -> None:
    """--launcher none never asks the tree; a named launcher that is missing is explained."""
    proc = write_tree(tmp_path, SRUN_STEP)
    assert locate("none", {}, runtime=False, proc=proc).info.world_size == 1
    with pytest.raises(StrippedEnvironmentError, match="started by slurmstepd"):
        locate("slurm", {}, runtime=False, proc=proc)


def test_the_tree_is_read_only_when_nothing_is_detected() -> None:
    """A detected launcher answers without the tree; no tree (a recorded env) asks nothing."""

    def never() -> Origin:
        raise AssertionError("the tree was read")

    assert choose("auto", SRUN_2N_4T[1], never).info.launcher == "slurm"
    assert choose("none", {}, never).info.world_size == 1
    assert started_by(Origin((), "", None)) is None
    # locate with a given env reads no /proc unless asked: a recorded environment.
    assert locate("auto", {}, runtime=False).info.world_size == 1


def test_a_missing_named_launcher_without_a_starter_keeps_its_hint(tmp_path: Path) -> None:
    """On a login node (no daemon above), --launcher slurm still says how to start the job."""
    proc = write_tree(tmp_path, {"self": ("python", 7, ""), 7: ("bash", 1, ""), 1: ("init", 0, "")})
    with pytest.raises(LauncherNotFoundError, match="auto-detection finds 'none'"):
        locate("slurm", {}, runtime=False, proc=proc)


def test_reading_the_real_tree_takes_milliseconds() -> None:
    """The real /proc: under 50 ms even on a loaded machine (it takes well under 1 ms)."""
    start = time.perf_counter()
    for _ in range(10):
        origin({})
    assert (time.perf_counter() - start) / 10 < 0.05


@pytest.mark.parametrize(
    ("env", "files", "name", "evidence"),
    [
        (
            {"APPTAINER_CONTAINER": "/img/pytorch.sif"},
            [],
            "apptainer",
            "$APPTAINER_CONTAINER is set",
        ),
        (
            {"SINGULARITY_CONTAINER": "/img/old.sif"},
            [],
            "apptainer",
            "$SINGULARITY_CONTAINER is set",
        ),
        ({}, [".singularity.d/env"], "apptainer", "/.singularity.d exists"),
        ({"CH_RUNNING": "Weird Al Yankovic"}, [], "charliecloud", "$CH_RUNNING is set"),
        ({}, [".lock"], "enroot", "/.lock exists"),
        ({}, ["run/.containerenv"], "podman", "/run/.containerenv exists"),
        ({"container": "podman"}, [], "podman", "$container is 'podman'"),
        ({}, [".dockerenv"], "docker", "/.dockerenv exists"),
    ],
)
def test_the_container_runtime_is_named_from_its_markers(
    tmp_path: Path, env: dict[str, str], files: list[str], name: str, evidence: str
) -> None:
    """Each runtime's documented variable or marker file names it."""
    for path in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    found = container(env, str(tmp_path))
    assert found is not None
    assert (found.runtime.name, found.evidence) == (name, evidence)


def test_no_marker_no_container(tmp_path: Path) -> None:
    """A bare root and environment: no container; /dev/shm's size is read where it exists."""
    assert container({"container": "lxc"}, str(tmp_path)) is None
    assert shm_bytes(str(tmp_path / "missing")) is None
    size = shm_bytes(str(tmp_path))
    assert size is not None
    assert size > 0
