"""CPU binding under real launchers on this machine (2 CPUs): each rank's affinity, as it runs.

`distenv run --numa-binding` binds each rank as it starts; `init_dist` binds under srun with
``DISTENV_CPU_BINDING``; a binding the launcher made is kept. Every rank finishes an all_reduce
(tests/support/integration/rank_check.py reports its ``os.sched_getaffinity(0)``). The machine has
no accelerator in sysfs, so ``auto`` shares its cores out: one CPU per rank (the test machine,
tests/harness/setup.sh's, has CPUs 0 and 1 and no SMT).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distenv.master import LOCAL_HOST, free_port
from tests.support.integration.helpers import (
    DISTENV_RUN,
    JOB_NAME,
    OMPI,
    PYTHON,
    REPO,
    Harness,
    check_world,
    rank_check,
    wait_all,
)

TWO_RANKS = [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]
KEPT = "keeping that binding"


def test_distenv_run_binds_each_rank(harness: Harness) -> None:
    """`distenv run -n 2 --numa-binding auto`: rank 0 on CPU 0, rank 1 on CPU 1, one thread each;
    under `taskset -c 1` both keep CPU 1 and the launcher says so once."""
    bound, kept = wait_all(
        [
            harness.start([*DISTENV_RUN, "-n", "2", "--numa-binding", "auto", *rank_check()[1:]]),
            harness.start(
                [
                    "taskset",
                    "-c",
                    "1",
                    *DISTENV_RUN,
                    "-n",
                    "2",
                    "--numa-binding",
                    "node",
                    *rank_check()[1:],
                ]
            ),
        ]
    )
    recs = check_world(bound, launcher="pytorch", layouts=TWO_RANKS, master=LOCAL_HOST)
    assert [r["affinity"] for r in recs] == [[0], [1]], bound.text
    assert [r["omp_num_threads"] for r in recs] == ["1", "1"], bound.text
    assert "local rank 0 on CPUs 0, local rank 1 on CPUs 1" in bound.stderr, bound.text
    recs = check_world(kept, launcher="pytorch", layouts=TWO_RANKS, master=LOCAL_HOST)
    assert [r["affinity"] for r in recs] == [[1], [1]], kept.text
    assert kept.stderr.count(KEPT) == 1, kept.text


@pytest.mark.slurm
def test_srun_ranks_bind_in_init_dist(harness: Harness) -> None:
    """`srun -n 2` with DISTENV_CPU_BINDING=auto: each rank's init_dist binds it to its own CPU
    and sets OMP_NUM_THREADS; `srun --cpu-bind=cores` whose ranks are already bound (this test
    cluster runs task/none, so `taskset -c 1` inside the step makes that binding) keeps it, and
    only local rank 0 says so."""
    env = harness.env("one", extra={"DISTENV_CPU_BINDING": "auto"})
    srun = ["srun", "-J", JOB_NAME, "-n", "2"]
    bound, kept = wait_all(
        [
            harness.start([*srun, *rank_check()], cluster="one", env=env),
            harness.start(
                [*srun, "--cpu-bind=cores", "taskset", "-c", "1", *rank_check()],
                cluster="one",
                env=env,
            ),
        ]
    )
    recs = check_world(bound, launcher="slurm", layouts=TWO_RANKS)
    assert [r["affinity"] for r in recs] == [[0], [1]], bound.text
    assert [r["omp_num_threads"] for r in recs] == ["1", "1"], bound.text
    recs = check_world(kept, launcher="slurm", layouts=TWO_RANKS)
    assert [r["affinity"] for r in recs] == [[1], [1]], kept.text
    assert kept.stderr.count(KEPT) == 1, kept.text


NUMA_RANK = str(REPO / "tests" / "support" / "scripts" / "numa_rank.py")


@pytest.fixture
def local(tmp_path: Path) -> Harness:
    """Launches on this machine alone (torchrun): no Slurm cluster, no MPI, no setup.sh run."""
    return Harness.local(tmp_path)


@pytest.mark.gpu
def test_node_binding_matches_torchrun_on_a_gpu_machine(local: Harness) -> None:
    """On a GPU machine, from its real sysfs: `init_dist(cpu_binding="node")` binds each rank to
    exactly the CPUs torch's `--numa-binding node` computes for its GPU (torch/numa/binding.py);
    where numactl is installed, `torchrun --numa-binding node` itself starts each rank on them."""
    import torch

    gpus = torch.cuda.device_count()
    assert gpus >= 1

    # Each its own port: the two run at once (torchrun's default, 29500, is one port for both).
    def torchrun() -> list[str]:
        return [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
                "--master-port", str(free_port())]  # fmt: skip

    launches = [local.start([*torchrun(), NUMA_RANK, "--bind"])]
    if shutil.which("numactl"):
        launches.append(local.start([*torchrun(), "--numa-binding", "node", NUMA_RANK]))
    results = wait_all(launches)
    for result in results:
        assert result.returncode == 0, result.text
    ours = sorted((json.loads(line) for line in results[0].stdout.splitlines()), key=_rank)
    assert [r["rank"] for r in ours] == list(range(gpus)), results[0].text
    for record in ours:
        assert record["all_reduce"] == gpus, record
        assert record["distenv"] == record["torch"], record
    if len(results) == 2:
        theirs = sorted((json.loads(line) for line in results[1].stdout.splitlines()), key=_rank)
        assert [r["started"] for r in theirs] == [r["distenv"] for r in ours], results[1].text


def _rank(record: dict[str, int]) -> int:
    return record["rank"]


@pytest.mark.mpi
def test_mpirun_binding_is_kept(harness: Harness) -> None:
    """`mpirun.openmpi -np 2` binds each rank to a core itself (Open MPI's default for 2 ranks):
    init_dist with DISTENV_CPU_BINDING=auto keeps it, says so once, and sets one thread per core
    held; under `--bind-to none` distenv binds them, silently."""
    env = harness.env(ompi=True, extra={"DISTENV_CPU_BINDING": "auto"})
    kept, bound = wait_all(
        [
            harness.start([*OMPI, "-np", "2", *rank_check()], env=env),
            harness.start([*OMPI, "-np", "2", "--bind-to", "none", *rank_check()], env=env),
        ]
    )
    for result in (kept, bound):
        recs = check_world(result, launcher="mpi", layouts=TWO_RANKS, master=LOCAL_HOST)
        assert [r["affinity"] for r in recs] == [[0], [1]], result.text
        assert [r["omp_num_threads"] for r in recs] == ["1", "1"], result.text
    assert kept.stderr.count(KEPT) == 1, kept.text
    assert KEPT not in bound.stderr, bound.text
