"""Each rank's CPUs and thread count when a local launcher starts it (``distenv run --numa-binding``).

The binding is decided once, in the launcher, for every rank of the node
(`distenv.placement.apply.place_ranks`), and applied to each rank as it starts
(`distenv.local.supervise`): the rank's interpreter, its threads and its children all inherit it,
as under torchrun's ``numactl --physcpubind`` wrapping, without numactl.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from distenv.local.output import tell
from distenv.placement.apply import place_ranks, threads_each
from distenv.placement.cpus import format_cpus
from distenv.placement.topology import read_topology
from distenv.settings import OMP_VAR, Settings

__all__ = ["RankCpus", "rank_cpus", "thread_env"]


@dataclass(frozen=True)
class RankCpus:
    """What a local launcher gives one rank besides its contract.

    Attributes:
        env: ``OMP_NUM_THREADS`` where distenv chose it (else empty).
        cpus: The CPUs to bind it to, or None to leave its affinity as inherited.
    """

    env: dict[str, str]
    cpus: frozenset[int] | None = None


def thread_env(who: str, nproc: int, settings: Settings) -> dict[str, str]:
    """Return ``OMP_NUM_THREADS`` for each of several unbound ranks on this node, unless the user
    set it: the cores they may use, shared among them (at least 1; torchrun sets 1)."""
    if nproc <= 1 or settings.omp_num_threads is not None:
        return {}
    threads = threads_each(read_topology(), nproc)
    # N ranks each starting one OpenMP thread per core would fight over the cores.
    tell(
        f"distenv {who}: setting {OMP_VAR}={threads} for each of the {nproc} ranks to avoid "
        "oversubscribing the CPUs; set it yourself to tune"
    )
    return {OMP_VAR: str(threads)}


def rank_cpus(
    who: str, nproc: int, settings: Settings, mode: str | None, env: Mapping[str, str]
) -> list[RankCpus]:
    """Return each of the `nproc` local ranks' CPUs and thread count for binding `mode`.

    Says once, on the launcher's stderr, how the ranks are bound, or why they keep the affinity
    the launcher was started with.
    """
    if mode is None:
        return [RankCpus(thread_env(who, nproc, settings))] * nproc
    placement = place_ranks(mode, nproc, env)
    if placement.note is not None:
        tell(f"distenv {who}: --numa-binding {mode}: {placement.note}")
    if not placement.bound:
        return [RankCpus(thread_env(who, nproc, settings))] * nproc
    own = settings.omp_num_threads is not None
    shares = ", ".join(
        f"local rank {rank} on CPUs {format_cpus(cpus)}" for rank, cpus in enumerate(placement.cpus)
    )
    tell(
        f"distenv {who}: --numa-binding {mode}: {shares}"
        + ("" if own else f" ({OMP_VAR}: each rank's cores)")
    )
    return [
        RankCpus({} if own else {OMP_VAR: str(placement.threads(rank))}, cpus)
        for rank, cpus in enumerate(placement.cpus)
    ]
