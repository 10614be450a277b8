"""MPI launchers for real: Open MPI's mpirun, MPICH's mpiexec.hydra, and srun --mpi=pmix/pmi2.

No MASTER_ADDR is given anywhere: alone, distenv.resolve asks rank 0 for its host over MPI
(mpi4py); inside a Slurm allocation the master is the allocation's first host. MPICH runs need
the mpi4py shim from setup.sh (LD_LIBRARY_PATH + MPI4PY_MPIABI=mpich), else every rank is a
singleton.
"""

from __future__ import annotations

import socket

import pytest

from tests.integration.helpers import (
    JOB_NAME,
    OMPI,
    ONE_NODE,
    PYTHON,
    STEPS,
    TWO_BY_TWO,
    Harness,
    check_world,
    rank_check,
    wait_all,
)

pytestmark = pytest.mark.mpi


def test_mpirun_and_hydra_alone_find_the_master_over_mpi(harness: Harness) -> None:
    """`mpirun.openmpi -np 4` and `mpiexec.hydra -n 4`, auto and --launcher mpi: master via mpi4py.

    mpi4py's COMM_WORLD must see the same ranks as distenv (rank_check --mpi).
    """
    ompi_env = harness.env(ompi=True)
    mpich_env = harness.env(mpich=True)
    launches = [
        harness.start(
            [*OMPI, "--oversubscribe", "-np", "4", *rank_check("--mpi", *args)], env=ompi_env
        )
        for args in ((), ("--launcher", "mpi"))
    ] + [
        harness.start(["mpiexec.hydra", "-n", "4", *rank_check("--mpi", *args)], env=mpich_env)
        for args in ((), ("--launcher", "mpi"))
    ]
    host = socket.gethostname()
    for result in wait_all(launches):
        recs = check_world(result, launcher="mpi", layouts=ONE_NODE, master=host, mpi=True)
        assert {r["info"]["job_id"] for r in recs} == {None}


@pytest.mark.slurm
def test_mpi_launchers_inside_salloc(harness: Harness) -> None:
    """mpirun / mpiexec.hydra inside `salloc -N 2` (run on the submit host): 2 ranks per node.

    auto and --launcher mpi agree (master = the allocation's first host); --launcher slurm
    is refused, naming mpi: SLURM_PROCID there describes mpirun's daemons, not the ranks.
    """
    alloc = ["salloc", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", PYTHON, STEPS]

    def steps(launcher: list[str]) -> list[str]:
        cmds = [[*launcher, *rank_check(*args)] for args in ((), ("--launcher", "mpi"))]
        cmds.append([*launcher, *rank_check("--launcher", "slurm")])
        return [arg for cmd in cmds for arg in (*cmd, ":::")][:-1]

    ompi, hydra = wait_all(
        [
            harness.start(
                [*alloc, *steps([*OMPI, "-np", "4"])],
                env=harness.env("multi", ompi=True),
                cluster="multi",
            ),
            harness.start(
                [*alloc, *steps(["mpiexec.hydra", "-n", "4"])],
                env=harness.env("multi", mpich=True),
                cluster="multi",
            ),
        ]
    )
    for result in (ompi, hydra):
        result.ok()
        auto, named, wrong = result.steps()
        for s in (auto, named):
            # master: the allocation's first host, where ranks 0 and 1 run (n1 on an idle cluster)
            recs = check_world(s, launcher="mpi", layouts=TWO_BY_TWO)
            assert len({r["hostname"] for r in recs}) == 2
        assert wrong.returncode != 0, wrong.text
        assert "rank_check: slurm: " in wrong.stderr, wrong.text
        assert "started by mpi" in wrong.stderr, wrong.text
        assert "--launcher mpi" in wrong.stderr, wrong.text
        assert not wrong.records(), wrong.text


@pytest.mark.slurm
def test_srun_mpi_plugins(harness: Harness) -> None:
    """`srun --mpi=pmix` (Open MPI's mpi4py) and `--mpi=pmi2` (MPICH): auto says slurm, mpi too.

    Under these plug-ins the MPI ranks are Slurm's tasks, so `--launcher mpi` is accepted and takes
    the step's layout (labelled mpi); mpi4py sees the same world either way.
    """
    launches = []
    for plugin, mpich in (("pmix", False), ("pmi2", True)):
        env = harness.env("one", mpich=mpich)
        for args in ((), ("--launcher", "mpi")):
            argv = [
                "srun",
                "-J",
                JOB_NAME,
                f"--mpi={plugin}",
                "-n",
                "4",
                *rank_check("--mpi", *args),
            ]
            launches.append(harness.start(argv, env=env, cluster="one"))
    results = wait_all(launches)
    host = socket.gethostname()
    for result, launcher in zip(results, ["slurm", "mpi", "slurm", "mpi"], strict=True):
        check_world(result, launcher=launcher, layouts=ONE_NODE, master=host, mpi=True)


def test_mpi4py_on_the_wrong_mpi_library_is_explained(harness: Harness) -> None:
    """Hydra ranks whose mpi4py loads Open MPI (no shim) are singletons: a clear error, no hang."""
    env = harness.env()  # deliberately without the MPICH shim
    result = harness.run(
        ["mpiexec.hydra", "-n", "2", PYTHON, "-m", "distenv", "info", "--json"], env=env
    )
    assert result.returncode != 0, result.text
    assert "mpi4py sees rank 0 of 1, but the launcher's variables say rank" in result.stderr
    assert "MPI4PY_MPIABI=mpich" in result.stderr
