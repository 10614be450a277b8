"""Whether the backend's own connect proves the process group: then the group-up check is skipped.

`distenv.bootstrap.group.join_group` checks over the store that every rank came up after
``init_process_group`` returned (`distenv.bootstrap.group.group_up`), because a returned init
need not mean that every peer's did. Where the backend's initialisation is itself collective (it
returns on no rank before every rank has joined it), that round trip proves nothing more, and
`proves_group` says so; rank 0 then only releases the group (the collision guard,
`distenv.bootstrap.channel.Channel.release`).

Measured on torch 2.13 (docs/faults.md, "Which check proves the group"):

- gloo's eager full-mesh connect does **not** prove it. In each pair one side listens and the
  other connects, by the order of their addresses; the connecting side counts itself connected
  as soon as the kernel accepts its connection into the listener's backlog. A rank stopped right
  after it published its address lets every peer that connects to it return from init (rank 0
  among them, when the addresses fall that way), while the peers it should connect to wait past
  gloo's timeout, until it resumes. ``TORCH_GLOO_LAZY_INIT`` (connect on first use) proves less.
- NCCL's eager initialisation (``device_id=`` given) is ``ncclCommInitRank``, collective: it
  "implicitly synchronizes with other ranks" (NCCL's documentation of ``ncclCommInitRank``; not
  measured here, where no GPU is), unless ``TORCH_NCCL_USE_COMM_NONBLOCKING`` makes it return at once. Without
  ``device_id`` NCCL creates its communicator at the first collective: nothing is proven.
- A multi-backend string (``cpu:gloo,cuda:nccl``) creates every backend on every rank in the same
  init: it proves the group where one of its backends does.
- Any other backend (mpi, ucc, a third party's): not known to prove it, so the check is kept.

Pure: reads only the mapping it is given (torch's own variables, as torch parses them).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["NCCL_NONBLOCKING_VAR", "proves_group"]

#: torch's switch for NCCL's non-blocking communicator creation.
NCCL_NONBLOCKING_VAR = "TORCH_NCCL_USE_COMM_NONBLOCKING"
# What torch's getCvarBool reads as true (torch/csrc/distributed/c10d/Utils.hpp).
_TRUE = frozenset(("1", "y", "yes", "t", "true"))


def proves_group(backend: str, *, eager_device: bool, environ: Mapping[str, str]) -> bool:
    """Return whether ``init_process_group(backend=backend)`` returning proves every rank joined.

    Args:
        backend: The backend string as given to ``init_process_group`` (``"nccl"``,
            ``"cpu:gloo,cuda:nccl"``, ...).
        eager_device: Whether ``device_id=`` is passed (NCCL then creates its communicator in
            init, collectively).
        environ: The process environment (torch's switches are read from it).
    """
    return any(
        _proves(part.rpartition(":")[2].strip().lower(), eager_device, environ)
        for part in backend.split(",")
    )


def _proves(name: str, eager_device: bool, environ: Mapping[str, str]) -> bool:
    """Return whether one backend's initialisation is collective over every rank."""
    if name == "nccl":
        nonblocking = environ.get(NCCL_NONBLOCKING_VAR, "").strip().lower() in _TRUE
        return eager_device and not nonblocking
    # gloo (eager or lazy, see the module's docstring), mpi, ucc, any other: not proven.
    return False
