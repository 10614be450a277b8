"""`seed_everything`: one call that seeds Python's, NumPy's and torch's generators."""

from __future__ import annotations

import importlib
import random

from distenv import comm
from distenv.errors import ConfigurationError, quoted

__all__ = ["check_seed", "seed_everything"]

# NumPy's legacy seed accepts [0, 2**32); keeping every generator within it keeps them in step.
SEED_SPAN = 2**32


def check_seed(seed: object) -> int:
    """Return `seed` if it is an int in ``[0, 2**32)``, else raise naming it.

    Raises:
        ConfigurationError: If `seed` is not such an int.
    """
    if type(seed) is not int or not 0 <= seed < SEED_SPAN:
        raise ConfigurationError(
            "seed",
            f"seed={quoted(seed)} is not an integer in [0, 2**32)",
            hint="pass a non-negative int below 4294967296",
        )
    return seed


def seed_everything(seed: int, per_rank: bool = False) -> int:
    """Seed `random`, NumPy (when installed) and torch (CPU and every CUDA device).

    Args:
        seed: The seed, an int in ``[0, 2**32)``.
        per_rank: Add this process's rank (the group's, else what `init_dist`/`setup` resolved)
            so ranks draw different streams, e.g. for data augmentation; the sum wraps at 2**32.

    Returns:
        The seed used, rank included.

    Raises:
        ConfigurationError: If `seed` is not an int in range.
    """
    seed = check_seed(seed)
    if per_rank:
        seed = (seed + comm.known_rank()) % SEED_SPAN
    random.seed(seed)
    try:
        numpy = importlib.import_module("numpy")
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    import torch

    # Also seeds every CUDA device, lazily, without initialising CUDA here.
    torch.manual_seed(seed)
    return seed
