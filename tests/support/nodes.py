"""The options of one multi-node ``distenv run``, node by node: docs/start/local.md's recipe.

Tests start the node agents of one run side by side on this machine (master 127.0.0.1) or one
per network-namespace "node" (tests/support/netlab.py). Each node's command is the caller's
``distenv run`` (``python -m distenv run``, the console script, ...), then `node_options` for that
node, then the caller's own options, program and arguments.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from distenv.master import free_port


def node_options(
    nnodes: int,
    *,
    ranks: int | Sequence[int] = 1,
    run_id: str | Sequence[str] = "",
    master: str = "127.0.0.1",
    port: int | str = 0,
) -> list[list[str]]:
    """Return ``-n``, ``--nnodes``, ``--node-rank``, ``--master-*`` and ``--run-id`` per node.

    Args:
        nnodes: How many nodes (agents) the run has.
        ranks: The ranks of every node (``-n``), or of each node in order.
        run_id: The run's id on every node (a fresh one by default, so that no other run's
            ranks can meet this one's), or each node's in order (a node told another id is
            another run's).
        master: Node 0's address, as every node is told it.
        port: Node 0's store port; a free one of this machine by default.
    """
    counts = [ranks] * nnodes if isinstance(ranks, int) else list(ranks)
    ids = [run_id or f"run-{uuid.uuid4().hex[:8]}"] * nnodes if isinstance(run_id, str) else run_id
    assert len(counts) == len(ids) == nnodes, f"{nnodes} nodes: ranks {counts}, run ids {ids}"
    port = str(port or free_port())
    return [
        ["-n", str(count), "--nnodes", str(nnodes), "--node-rank", str(node),
         "--master-addr", master, "--master-port", port, "--run-id", ids[node]]
        for node, count in enumerate(counts)
    ]  # fmt: skip
