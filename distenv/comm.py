"""Helpers for code that runs on every rank: who am I, rank-0-only work, per-node groups, averaging.

Each helper works before `init_dist` too (as the single process it then is), so one script runs
alone and distributed unchanged. torch is imported inside the functions.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from distenv.errors import ConfigurationError, InitError
from distenv.state import current_info

if TYPE_CHECKING:
    import torch
    import torch.distributed

__all__ = [
    "allreduce_grads",
    "allreduce_params",
    "barrier",
    "get_dist_info",
    "get_local_group",
    "is_main_process",
    "master_only",
    "plan_buckets",
]

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K", bound=Hashable)

DEFAULT_BUCKET_MB = 25.0

# The default group the cached local group belongs to, and that group; rebuilt after the default
# group is destroyed and recreated.
_local_group: tuple[object, torch.distributed.ProcessGroup] | None = None


def _initialized() -> bool:
    # Before anyone imported torch.distributed no group can exist; do not import torch to say so.
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def get_dist_info() -> tuple[int, int]:
    """Return ``(rank, world_size)`` of the default process group; ``(0, 1)`` without one."""
    if not _initialized():
        return 0, 1
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def known_rank() -> int:
    """Return this process's rank: the group's, else what `setup`/`init_dist` resolved, else 0."""
    if _initialized():
        return get_dist_info()[0]
    info = current_info()
    return 0 if info is None else info.rank


def is_main_process() -> bool:
    """Return whether this is global rank 0 (True without a process group)."""
    return get_dist_info()[0] == 0


def master_only(func: Callable[P, R]) -> Callable[P, R | None]:
    """Decorate `func` to run on global rank 0 only; elsewhere the call returns None at once.

    No collective happens inside: pair it with `barrier` when other ranks must wait for the
    result (a checkpoint written, a dataset downloaded).
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        if is_main_process():
            return func(*args, **kwargs)
        return None

    return wrapper


def barrier() -> None:
    """Wait until every rank of the default group arrives; do nothing without a group."""
    if _initialized():
        import torch.distributed as dist

        dist.barrier()


def get_local_group() -> torch.distributed.ProcessGroup:
    """Return the process group of the ranks on this node (its `RankInfo.node_rank`).

    Nodes may hold different numbers of ranks. The first call is collective: every rank must make
    it, because `torch.distributed.new_group` must create every group, in the same order, on every
    rank. The result is cached for the life of the default group.

    Raises:
        InitError: If no process group exists, or this rank's node is unknown because neither
            `init_dist` nor `setup` ran.
    """
    global _local_group
    if not _initialized():
        raise InitError(
            "comm",
            "get_local_group() needs the default process group, which does not exist",
            hint="call distenv.init_dist() first",
        )
    import torch.distributed as dist

    world = dist.group.WORLD
    if _local_group is not None and _local_group[0] is world:
        return _local_group[1]
    info = current_info()
    if info is None or info.node_rank is None:
        raise InitError(
            "comm",
            "get_local_group() cannot tell which node this rank is on"
            + ("" if info is None else f": the {info.launcher} launcher names no node layout"),
            hint="call distenv.setup() (or init_dist) before the process group is created"
            if info is None
            else "create the group with distenv.init_dist(): its roll call numbers the nodes",
        )
    import torch

    # A tensor, not all_gather_object: that one needs NumPy (torch >= 2.6) and pickles.
    device = None
    if dist.get_backend() == "nccl":  # NCCL moves CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    mine_id = torch.tensor([info.node_rank], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine_id) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine_id)
    nodes = [int(t.item()) for t in gathered]
    mine: torch.distributed.ProcessGroup | None = None
    # Every rank creates every group, in the same (sorted) order: new_group is collective.
    for node in sorted(set(nodes)):
        group = dist.new_group([rank for rank, n in enumerate(nodes) if n == node])
        if node == info.node_rank:
            mine = group
    if mine is None:  # our own id is among those gathered; this cannot happen
        raise InitError("comm", f"node {info.node_rank} missing from the gathered node ids")
    _local_group = (world, mine)
    return mine


def plan_buckets(items: Sequence[tuple[K, int]], limit: int) -> list[list[int]]:
    """Split tensors into buckets for coalesced collectives; return lists of indices into `items`.

    Tensors of one key (dtype and device) are packed in order until the next would push the bucket
    past `limit` bytes; a tensor bigger than `limit` gets a bucket of its own. Buckets never mix
    keys. The plan depends on the items only, so every rank computes the same one.

    Args:
        items: ``(key, nbytes)`` per tensor, in a fixed order.
        limit: The bucket size in bytes (> 0).
    """
    buckets: list[list[int]] = []
    open_: dict[K, tuple[list[int], int]] = {}
    for index, (key, nbytes) in enumerate(items):
        indices, size = open_.get(key, ([], 0))
        if indices and size + nbytes > limit:
            buckets.append(indices)
            indices, size = [], 0
        indices.append(index)
        size += nbytes
        if size >= limit:
            buckets.append(indices)
            open_.pop(key, None)
        else:
            open_[key] = (indices, size)
    buckets.extend(indices for indices, _ in open_.values())
    return buckets


def _average(tensors: list[torch.Tensor], bucket_size_mb: float, what: str) -> None:
    """Replace each tensor by its mean across ranks, bucket by bucket."""
    if bucket_size_mb <= 0:
        raise ConfigurationError(
            "comm",
            f"bucket_size_mb={bucket_size_mb!r} must be positive",
            hint=f"use the default {DEFAULT_BUCKET_MB:g}, or a few tens of MB",
        )
    world_size = get_dist_info()[1]
    if world_size == 1:
        return
    import torch
    import torch.distributed as dist

    for tensor in tensors:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise ConfigurationError(
                "comm",
                f"{what} has a {tensor.dtype} tensor, which has no average",
                hint="pass floating-point parameters only",
            )
    limit = int(bucket_size_mb * 1024 * 1024)
    items = [((t.dtype, t.device), t.numel() * t.element_size()) for t in tensors]
    buckets = plan_buckets(items, limit)
    # One buffer of bytes per device, as large as its largest copied bucket, serves every bucket
    # copied there, whatever its dtype: the copies never cost more than one bucket, whenever the
    # backend drops its own reference to a collective's tensor (gloo's worker thread may, after
    # the call returns, so a buffer per bucket left two buckets alive at times).
    sizes: dict[torch.device, int] = {}
    for indices in buckets:
        if len(indices) > 1 or not tensors[indices[0]].is_contiguous():
            device = tensors[indices[0]].device
            nbytes = sum(items[i][1] for i in indices)
            sizes[device] = max(sizes.get(device, 0), nbytes)
    buffers = {d: torch.empty(n, dtype=torch.uint8, device=d) for d, n in sizes.items()}
    with torch.no_grad():
        for indices in buckets:
            bucket = [tensors[i] for i in indices]
            if len(bucket) == 1 and bucket[0].is_contiguous():
                # A tensor alone in its bucket (often one larger than the bucket) is reduced in
                # place: a copy would cost its size in memory and time for nothing.
                dist.all_reduce(bucket[0])
                bucket[0].div_(world_size)
                continue
            # One collective per bucket, on the front of its device's buffer seen as its dtype.
            nbytes = sum(items[i][1] for i in indices)
            flat = buffers[bucket[0].device][:nbytes].view(bucket[0].dtype)
            torch.cat([t.reshape(-1) for t in bucket], out=flat)
            dist.all_reduce(flat)
            # SUM then divide: gloo has no ReduceOp.AVG.
            flat.div_(world_size)
            offset = 0
            for tensor in bucket:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


def allreduce_params(
    params: Iterable[torch.Tensor], *, bucket_size_mb: float = DEFAULT_BUCKET_MB
) -> None:
    """Average parameters (their data) across all ranks, in place.

    Tensors are coalesced into buckets of at most `bucket_size_mb` (one per dtype and device; a
    larger tensor travels alone), copied into one buffer per device that every bucket reuses, so
    the extra memory is bounded by one bucket. A no-op without a group or at world size 1.

    Args:
        params: Parameters or tensors, e.g. ``model.parameters()`` (same order on every rank).
        bucket_size_mb: The bucket size in MiB.

    Raises:
        ConfigurationError: If `bucket_size_mb` is not positive or a tensor is not floating point.
    """
    _average([p.detach() for p in params], bucket_size_mb, "allreduce_params")


def allreduce_grads(
    params: Iterable[torch.Tensor], *, bucket_size_mb: float = DEFAULT_BUCKET_MB
) -> None:
    """Average the gradients of `params` across all ranks, in place; ``None`` gradients are skipped.

    Every rank must have gradients for the same parameters. Bucketing as in `allreduce_params`.

    Args:
        params: Parameters, e.g. ``model.parameters()`` (same order on every rank).
        bucket_size_mb: The bucket size in MiB.

    Raises:
        ConfigurationError: If `bucket_size_mb` is not positive or a gradient is not floating point.
    """
    grads = [p.grad.detach() for p in params if p.grad is not None]
    _average(grads, bucket_size_mb, "allreduce_grads")
