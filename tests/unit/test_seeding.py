"""seed_everything: every generator seeded, per-rank offsets, validated seeds."""

from __future__ import annotations

import random
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing
    import torch

import distenv.comm
import distenv.seeding
from distenv import seed_everything
from distenv.errors import ConfigurationError


def draw():
    return random.random(), torch.rand(2).tolist()


def test_same_seed_same_streams():
    """Seeding twice with one seed replays random's and torch's streams exactly."""
    assert seed_everything(1234) == 1234
    first = draw()
    seed_everything(1234)
    assert draw() == first
    seed_everything(1235)
    assert draw() != first


def test_numpy_seeded_when_installed():
    """NumPy's global generator is seeded too when NumPy is importable."""
    numpy = pytest.importorskip("numpy")
    seed_everything(5)
    first = numpy.random.rand(3).tolist()
    seed_everything(5)
    assert numpy.random.rand(3).tolist() == first


def test_works_without_numpy(monkeypatch):
    """Without NumPy, random and torch are still seeded and no error escapes."""

    def no_numpy(name):
        raise ImportError(name)

    monkeypatch.setattr(distenv.seeding.importlib, "import_module", no_numpy)
    seed_everything(9)
    first = draw()
    seed_everything(9)
    assert draw() == first


@pytest.mark.parametrize(
    ("seed", "rank", "expected"),
    [
        pytest.param(100, 0, 100, id="rank0"),
        pytest.param(100, 3, 103, id="rank3"),
        pytest.param(2**32 - 1, 2, 1, id="wraps"),
    ],
)
def test_per_rank_adds_rank(monkeypatch, seed, rank, expected):
    """per_rank=True adds this process's rank to the seed, modulo 2**32."""
    monkeypatch.setattr(distenv.comm, "known_rank", lambda: rank)
    assert seed_everything(seed, per_rank=True) == expected
    assert seed_everything(seed) == seed


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, "7", True, None])
def test_invalid_seed(seed):
    """Seeds outside [0, 2**32) or not ints raise ConfigurationError quoting them."""
    with pytest.raises(ConfigurationError, match=rf"^seed: seed={seed!r} is not an integer"):
        seed_everything(seed)
