"""Who leads a node's roll call (`Role`), and where the node's socket lives.

Who leads is decided by what every rank knows alike (`Role.of`): the world size, the node's rank
count and ``DISTENV_NODE_LEADERS``. Small worlds keep the flat path, which needs no extra hop.

The node's socket lives in a private directory (`private_dir`: ``/tmp/distenv-<uid>``, mode 0700,
owned by this user, checked, never followed through a link) under a name derived from the job's
scope, the attempt, the host name and the node index (`socket_path`), so two jobs, two attempts
or two "nodes" on one host never meet. The sockets themselves are `distenv.bootstrap.leaders`'.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from typing import NamedTuple

from distenv.errors import ConfigurationError, DistEnvError
from distenv.rankinfo import RankInfo
from distenv.settings import LEADER_MODES, LEADERS_VAR

__all__ = ["MIN_WORLD", "Role", "private_dir", "socket_error", "socket_path"]

#: The smallest world in which ``DISTENV_NODE_LEADERS=auto`` batches: below it, rank 0's store
#: serves the flat roll call in milliseconds and the extra hop would cost more than it saves.
MIN_WORLD = 256


class Role(NamedTuple):
    """This rank's part in a batched roll call: its node's leader, or one of its members."""

    leader: bool
    path: str
    mode: str  # DISTENV_NODE_LEADERS as this rank read it, for messages

    @classmethod
    def of(cls, info: RankInfo, mode: str, scope: str, restart: str, hostname: str) -> Role | None:
        """Return this rank's role, or None where the job takes the flat roll call.

        Batched where ranks share a node whose ranks are counted and numbered
        (``local_world_size`` > 1), in a world of at least `MIN_WORLD` ranks (``auto``) or in
        any (``on``); never with ``off``. Every rank of the job decides alike.

        Raises:
            ConfigurationError: ``DISTENV_NODE_LEADERS`` is none of `LEADER_MODES`, or rank 0
                is not its node's local rank 0 (it must gather the whole job).
        """
        if mode not in LEADER_MODES:
            raise ConfigurationError(
                info.launcher,
                f"${LEADERS_VAR} is {mode!r}, expected one of {', '.join(LEADER_MODES)}",
                hint=f"unset {LEADERS_VAR} (auto), or set it to on or off",
                variable=LEADERS_VAR,
                value=mode,
            )
        local = info.local_world_size
        if mode == "off" or info.world_size == 1 or local is None or local == 1:
            return None
        if mode == "auto" and info.world_size < MIN_WORLD:
            return None
        if info.rank == 0 and info.local_rank != 0:
            raise ConfigurationError(
                info.launcher,
                f"rank 0 is local rank {info.local_rank} of its node, and node leaders need rank "
                "0 to lead its own node",
                hint=f"place rank 0 first on its node, or export {LEADERS_VAR}=off",
                variable=LEADERS_VAR,
                value=mode,
            )
        path = socket_path(
            scope, restart, hostname, info.node_rank, source=info.launcher, mode=mode
        )
        return cls(info.local_rank == 0, path, mode)


def _flat(mode: str) -> str:
    """The way out every node-socket error offers: the flat roll call, and the setting as it is."""
    return f"or export {LEADERS_VAR}=off for the flat roll call (it is {mode!r} here)"


def socket_error(
    kind: type[DistEnvError], info: RankInfo, mode: str, problem: str, fix: str
) -> DistEnvError:
    """Return a rank's error about its node's socket: `problem`, then `fix` or the flat path."""
    return kind(
        info.launcher,
        f"rank {info.rank}: {problem}",
        hint=f"{fix}, {_flat(mode)}",
        variable=LEADERS_VAR,
        value=mode,
    )


def private_dir(source: str, mode: str, root: str = "/tmp") -> str:  # noqa: S108 -- checked below
    """Return this user's private directory for node sockets under `root`, creating it (0700).

    `source` (the launcher) and `mode` (``DISTENV_NODE_LEADERS``) are for the messages.

    Raises:
        ConfigurationError: It exists but is a link, not a directory, another user's, or open
            to others.
    """
    uid = os.getuid()
    # Checked below (a directory of this user, mode 0700, not a link): not a guessable file.
    path = os.path.join(root, f"distenv-{uid}")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise ConfigurationError(
            source,
            f"node leaders cannot create their socket directory {path}: {exc.strerror}",
            hint=f"make {root} writable for this user, {_flat(mode)}",
            variable=LEADERS_VAR,
            value=mode,
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise ConfigurationError(
            source,
            f"{path} is not a private directory of this user (mode {stat.filemode(st.st_mode)}, "
            f"owner uid {st.st_uid}): node leaders will not put their sockets there",
            hint=f"remove {path} (distenv creates it with mode 0700), {_flat(mode)}",
            variable=LEADERS_VAR,
            value=mode,
        )
    return path


def socket_path(
    scope: str, restart: str, hostname: str, node: int | None, *, source: str, mode: str
) -> str:
    """Return the path of the node socket of `scope`'s attempt `restart` on this node.

    `source` and `mode` are `private_dir`'s, for its messages.
    """
    digest = hashlib.sha256(f"{scope}\0{restart}\0{hostname}\0{node}".encode()).hexdigest()
    return os.path.join(private_dir(source, mode), digest[:32] + ".sock")
