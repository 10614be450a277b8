"""The captured fixtures in tests/support/envs still describe what the launchers set today.

Runs tests/harness/capture_env.py live under every capture scenario (the very commands of
tests/harness/capture_all.py, about 20 s in all) and compares each rank with the fixture constant, on every variable a
launcher backend declares: the set present must be equal, and the values too, except those that
differ from run to run (job ids, ports, run ids) and the host name of cluster `one`, which is this
machine's.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from types import ModuleType

import pytest

from distenv.launchers.registry import BUILTIN
from tests.support.envs import mpi, slurm, torchrun
from tests.support.integration.helpers import HARNESS, REPO, Harness

DECLARED = frozenset(v.name for launcher in BUILTIN.values() for v in launcher.variables)
RUN_SPECIFIC = frozenset(
    {
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_ARRAY_JOB_ID",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "PMIX_NAMESPACE",
        "PMI_FD",  # a descriptor number of the launch's process table
    }
)
# srun sets a heterogeneous step's SLURM_DISTRIBUTION to block or cyclic from run to run where a
# component has one task (seen on srun_het_reversed's rank 0, and on srun_het_direct when it had
# one), so in a het step either value matches either.
HET_RANDOM = {"SLURM_DISTRIBUTION": frozenset({"block", "cyclic"})}
# Fixture module of each scenario family (as tests/support/envs/make_fixtures.py writes them).
MODULES = {"srun_": slurm, "sbatch_": slurm, "salloc_": slurm, "ompi_": mpi, "hydra_": mpi,
           "ompi5_": mpi, "mpich5_": mpi, "torchrun_": torchrun}  # fmt: skip
CAPTURES = REPO / "tests" / "support" / "envs" / "captures"


def _capture_all() -> ModuleType:
    """Import tests/harness/capture_all.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("capture_all", HARNESS / "capture_all.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _comparable(env: dict[str, str], live_host: str, captured_host: str) -> dict[str, str]:
    """Declared variables only, run-specific values blanked, this host named as when captured.

    In a heterogeneous step, a value Slurm picks at random (`HET_RANDOM`) reads as "<random>"
    when it is one of the values Slurm picks from.
    """
    het = "SLURM_HET_SIZE" in env
    return {
        k: "<run>"
        if k in RUN_SPECIFIC
        else "<random>"
        if het and v in HET_RANDOM.get(k, ())
        else captured_host
        if v == live_host
        else v
        for k, v in env.items()
        if k in DECLARED
    }


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.idle_clusters
def test_fixtures_match_live_launchers(harness: Harness) -> None:
    """Each rank's declared variables, live, equal the captured fixture's (fixtures cannot drift)."""
    runner = _capture_all()
    by_name = {sc.name: sc for sc in runner.SCENARIOS}
    base_env = harness.env()
    live_host = socket.gethostname()
    for name, sc in by_name.items():
        module = next(m for prefix, m in MODULES.items() if name.startswith(prefix))
        if sc.cluster:
            # Node placement (n1, n2, ...) as when captured: the previous job's nodes must be free.
            harness.wait_idle(sc.cluster)
        recs, message = runner.run_scenario(
            sc, base_env, harness.clusters, harness.env_sh["DISTENV_TEST_MPICH_LIB"]
        )
        assert recs is not None, f"{name}: {message}"
        fixture = getattr(module, name.upper())
        captured = [
            json.loads(line) for line in (CAPTURES / f"{name}.jsonl").read_text().splitlines()
        ]
        assert len(recs) == len(fixture) == len(captured), name
        for rank, (live, fixed, cap) in enumerate(zip(recs, fixture, captured, strict=True)):
            want = _comparable(dict(fixed), cap["hostname"], cap["hostname"])
            got = _comparable(live["env"], live_host, cap["hostname"])
            assert sorted(got) == sorted(want), f"{name} rank {rank}: variables differ"
            assert got == want, f"{name} rank {rank}"
