"""One detection asks each launcher each question at most once (`distenv.detection.layer`).

Agreement, the choice and the master query all need the same answers (for Hydra inside salloc,
`mpi`'s ``world`` in five places, Slurm's in three); a `Layer` hands each on. These tests count
every hook of every built-in launcher over every recorded environment of every launcher
(tests/support/envs, walked by `recorded`), auto and by name.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable

import pytest

from distenv import DistEnvError
from distenv.detection.layer import Layer, Layers
from distenv.detection.pipeline import locate
from distenv.launchers import Launcher
from distenv.launchers.registry import BUILTIN, MPI, SLURM
from tests.support.envs import mpi, recorded, slurm

HOOKS = (
    "detect",
    "world",
    "rank_info",
    "placed_rank_info",
    "scope",
    "default_master",
    "daemon_nodes",
    "allocation_master",
)
# Every recorded environment of every launcher (tests/support/envs), found by walking them.
CAPTURED = recorded()


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Count every call of every hook of every built-in launcher, its own calls included."""
    counts: collections.Counter[str] = collections.Counter()
    for launcher in BUILTIN.values():
        for hook in HOOKS:
            method = getattr(launcher, hook, None)
            if method is None:
                continue

            def counted(
                *args: object, _method: Callable[..., object] = method, _key: str = ""
            ) -> object:
                counts[_key] += 1
                return _method(*args)

            monkeypatch.setattr(
                launcher, hook, functools.partial(counted, _key=f"{launcher.name}.{hook}")
            )
    return counts


def test_captured_environments_are_found() -> None:
    """The table below covers the captured ranks of every module (not an empty loop)."""
    assert len(CAPTURED) > 100
    assert "mpi.HYDRA_IN_SALLOC_2N[3]" in CAPTURED


@pytest.mark.parametrize("launcher", ["auto", *BUILTIN])
def test_each_hook_is_asked_at_most_once_per_detection(
    asked: collections.Counter[str], launcher: str
) -> None:
    """No launcher is asked the same question twice while one `locate` runs."""
    for name, env in CAPTURED.items():
        asked.clear()
        with contextlib.suppress(DistEnvError):
            locate(launcher, env, runtime=False)
        repeated = {hook: n for hook, n in asked.items() if n > 1}
        assert repeated == {}, name


def test_hydra_inside_salloc_asks_mpi_and_slurm_once(asked: collections.Counter[str]) -> None:
    """The case that asked `mpi.world` five times: each answer once, and every one used."""
    locate("auto", mpi.HYDRA_IN_SALLOC_2N[3], runtime=False)
    assert asked["mpi.world"] == 1
    assert asked["slurm.world"] == 1
    assert asked["mpi.placed_rank_info"] == 1
    assert asked["slurm.daemon_nodes"] == 1
    assert asked["slurm.allocation_master"] == 1


def test_a_layer_keeps_an_error_and_raises_it_again() -> None:
    """A malformed variable is read once; every later question gets the same error."""
    layer = Layer(MPI, {"PMI_RANK": "x", "PMI_SIZE": "4"})
    with pytest.raises(DistEnvError) as first:
        layer.world()
    with pytest.raises(DistEnvError) as again:
        layer.world()
    assert again.value is first.value
    assert "PMI_RANK" in str(first.value)


def test_layers_hold_one_layer_per_launcher() -> None:
    """Every part of one detection shares the same answers: one `Layer` per launcher."""
    layers = Layers(slurm.SRUN_2N_4T[0])
    assert layers[SLURM] is layers[SLURM]
    assert layers[SLURM] is not layers[MPI]
    assert layers[SLURM].env is layers.env
    assert isinstance(layers[SLURM].launcher, Launcher)
    assert layers[SLURM].rank_info() is layers[SLURM].rank_info()
