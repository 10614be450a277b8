"""Node leaders: one rank per node speaks to rank 0's store for all of its node's ranks.

A flat roll call makes every rank a client of rank 0's store, and rank 0's single-threaded server
pays per request: at 16 384 ranks, eight round trips each are seconds of its time. Where several
ranks share a node, the node's local rank 0 leads it: the others (its *members*) hand their
check-in to it over a Unix socket, it writes one batched record for the node
(`distenv.bootstrap.batches`), reads rank 0's verdict once and hands it to each member, and the
group-up check goes the same way. Rank 0 then serves a few requests per node instead of per rank.
The sockets are here (`NodeListener`, a member's `Link`); the channels that use them are
`distenv.bootstrap.nodes`'.

Who leads is `distenv.bootstrap.role.Role`'s decision, and the node's socket lives in a private
directory under a name no other job, attempt or node shares (`distenv.bootstrap.role`). Both ends
check the other's user id (``SO_PEERCRED``); the leader refuses a check-in of another scope or
world. Every wait is bounded by the bootstrap's deadlines, and a closed connection is named at
once: a member whose leader died says so; a leader whose member died reports it to rank 0,
which names it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import struct
from typing import NamedTuple

from distenv.bootstrap.protocol import Message
from distenv.bootstrap.records import MAX_CHECKIN_BYTES, CheckIn, ForeignRecordError, parse_checkin
from distenv.bootstrap.role import MIN_WORLD, Role, private_dir, socket_error, socket_path
from distenv.deadline import Deadline, pause
from distenv.errors import ConfigurationError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo

__all__ = ["MIN_WORLD", "SLACK_S", "Link", "NodeListener", "Role", "private_dir", "socket_path"]

#: The longest line either end sends: a check-in, or a verdict and its place.
MAX_LINE = 128 * 1024
# The leader reports its node this long before the rendezvous timeout ends (at most), so that
# rank 0 names a member that never arrived with its node, not just as absent.
SLACK_S = 5.0
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _peer(sock: socket.socket) -> tuple[int, int]:
    """Return the pid and user id of the process at the other end of a Unix socket."""
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid


class _Lines:
    """A socket's incoming lines, read without blocking past a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer, self.closed = sock, b"", False

    def feed(self) -> None:
        """Read what is there (the socket is readable); note a closed connection."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
        self.buffer += data
        if len(self.buffer) > MAX_LINE and b"\n" not in self.buffer:
            self.closed = True  # nobody of this job sends that much: drop the connection

    def line(self) -> bytes | None:
        """Return the next whole line, without its newline, or None."""
        head, newline, rest = self.buffer.partition(b"\n")
        if not newline:
            return None
        self.buffer = rest
        return head


def _send(sock: socket.socket, line: str, deadline: Deadline) -> bool:
    """Send one line within `deadline`; return False if the other end is gone."""
    sock.settimeout(max(deadline.left(), 0.01))
    try:
        sock.sendall(line.encode() + b"\n")
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(False)


class Member(NamedTuple):
    """A member as its leader sees it: its check-in and its connection."""

    checkin: CheckIn
    lines: _Lines


class NodeListener:
    """The leader's end: its node's socket, its members' check-ins, and the answers it sends.

    Args:
        role: The leader's `Role`: its node's socket (`socket_path`) and the setting that chose it.
        info: The leader's RankInfo (its launcher and rank, for messages).
    """

    def __init__(self, role: Role, info: RankInfo) -> None:
        self.path, self.mode, self.info = role.path, role.mode, info
        self.members: list[Member] = []
        self.sock = self._bind()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.pending: list[_Lines] = []  # accepted, their check-in not read yet

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                sock.close()
                raise socket_error(
                    ConfigurationError,
                    self.info,
                    self.mode,
                    f"cannot open its node's socket {self.path}: {exc.strerror}",
                    "check the directory's file system",
                ) from None
            if _answers(self.path):
                sock.close()
                raise socket_error(
                    RendezvousError,
                    self.info,
                    self.mode,
                    f"another process already leads this node for this job (its socket "
                    f"{self.path} answers): two processes were started as local rank 0 of one "
                    "node",
                    "start one process per local rank on each node (check the launcher's task "
                    "layout)",
                ) from None
            os.unlink(self.path)  # left by a process of this attempt that died: nobody answers
            sock.bind(self.path)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
        return sock

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            conn, _ = self.sock.accept()
            if _peer(conn)[1] != os.getuid():
                conn.close()  # another user's process: never read
                return
            conn.setblocking(False)
            lines = _Lines(conn)
            self.pending.append(lines)
            self.selector.register(conn, selectors.EVENT_READ, lines)

    def _turn(self, deadline: Deadline) -> None:
        """Wait for one event (at most until `deadline`) and handle it."""
        for key, _ in self.selector.select(max(min(deadline.left(), 0.5), 0)):
            if key.data is None:
                self._accept()
            else:
                key.data.feed()

    def gather(self, checkin: CheckIn, count: int, deadline: Deadline) -> tuple[CheckIn, ...]:
        """Return this node's check-ins, the leader's first: all `count`, or those in by `deadline`.

        A check-in of another scope or world is answered ``refused`` and dropped; one that does
        not parse is dropped (nothing from the socket is trusted more than the store).
        """
        while len(self.members) < count - 1 and not deadline.passed():
            self._turn(deadline)
            self._take(checkin)
        self._take(checkin)
        return (checkin, *(m.checkin for m in self.members))

    def _take(self, own: CheckIn) -> None:
        for lines in list(self.pending):
            raw = lines.line()
            if raw is None and not lines.closed:
                continue
            self.pending.remove(lines)
            try:
                if raw is None or len(raw) > MAX_CHECKIN_BYTES:
                    raise ForeignRecordError("node socket", "no check-in")
                record = parse_checkin("node socket", raw)
            except ForeignRecordError:
                self._drop(lines)
                continue
            if record.scope != own.scope or record.world_size != own.world_size:
                _send(lines.sock, Message.REFUSED.encode(), Deadline.after(1.0))
                self._drop(lines)
                continue
            self.members.append(Member(record, lines))

    def _drop(self, lines: _Lines) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(lines.sock)
        lines.sock.close()

    def answer(self, line: str, deadline: Deadline) -> None:
        """Send `line` to every member; a late arrival is told ``late``."""
        for member in self.members:
            _send(member.lines.sock, line, deadline)
        self.close_door(deadline)

    def tell(self, line: str, deadline: Deadline) -> None:
        """Send `line` to every member (after the roll call: the door is closed already)."""
        for member in self.members:
            _send(member.lines.sock, line, deadline)

    def close_door(self, deadline: Deadline) -> None:
        """Stop taking members: whoever connected or connects now is told it came late."""
        self.selector.unregister(self.sock)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                conn, _ = self.sock.accept()
                self.pending.append(_Lines(conn))
        for lines in self.pending:
            _send(lines.sock, Message.LATE.encode(), deadline)
            self._drop(lines)
        self.pending = []
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def collect_up(self, deadline: Deadline) -> tuple[dict[int, str], list[int], list[int]]:
        """Return the members' group-up tokens, those whose connection closed, and the silent.

        Waits until every member has answered or closed, or until `deadline`.
        """
        tokens: dict[int, str] = {}
        gone: list[int] = []
        waiting = {m.checkin.rank: m for m in self.members}
        while waiting:
            for rank, member in list(waiting.items()):
                raw = member.lines.line()
                if raw is not None:
                    kind, _, token = Message.decode(raw.decode("ascii", "replace"))
                    if kind is Message.UP and len(token) == 16:
                        tokens[rank] = token
                    else:
                        gone.append(rank)
                    del waiting[rank]
                elif member.lines.closed:
                    gone.append(rank)
                    del waiting[rank]
            if not waiting or deadline.passed():
                break
            self._turn(deadline)
        return tokens, gone, sorted(waiting)

    def acknowledge(self, tokens: dict[int, str], deadline: Deadline) -> None:
        """Echo each member's token to it: rank 0 saw the whole job up."""
        for member in self.members:
            token = tokens.get(member.checkin.rank)
            if token is not None:
                _send(member.lines.sock, Message.ACK.encode(token), deadline)

    def close(self) -> None:
        """Close every connection and the socket (idempotent)."""
        for member in self.members:
            member.lines.sock.close()
        for lines in self.pending:
            lines.sock.close()
        self.members, self.pending = [], []
        with contextlib.suppress(OSError):
            self.selector.close()
        if self.sock.fileno() != -1:
            self.sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _answers(path: str) -> bool:
    """Return whether a process listens on the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
            return True
        except OSError:
            return False


class Link:
    """A member's end: its connection to its node's leader (made by `connect`).

    Args:
        sock: The connected socket.
        info: The member's RankInfo, for messages.
        leader_pid: The leader's process id (``SO_PEERCRED``), for messages.
    """

    def __init__(self, sock: socket.socket, info: RankInfo, leader_pid: int) -> None:
        self.sock, self.info, self.leader_pid = sock, info, leader_pid
        self.lines = _Lines(sock)

    @classmethod
    def connect(cls, role: Role, info: RankInfo, deadline: Deadline) -> Link:
        """Connect to the node's leader, retrying until it listens or `deadline` passes.

        Raises:
            RendezvousTimeoutError: No leader listened by `deadline`.
            RendezvousError: What listens there is another user's process, or the socket
                cannot be connected to for another reason than "not there yet".
        """
        path, delay = role.path, 0.001
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                break
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN):
                    raise socket_error(
                        RendezvousError,
                        info,
                        role.mode,
                        f"cannot connect to its node's socket {path}: {exc.strerror}",
                        "check the directory's file system",
                    ) from None
            if deadline.passed():
                raise RendezvousTimeoutError(
                    info.launcher,
                    f"{info.who}: its node's leader (local rank 0 on "
                    f"this host) did not open the node's socket {path} within "
                    f"{deadline.seconds:g} s",
                    hint="local rank 0 of this node did not start, or died first: its log (or "
                    "the launcher's exit codes) says why",
                )
            pause(min(delay, max(deadline.left(), 0)))
            delay = min(delay * 2, 0.05)
        pid, uid = _peer(sock)
        if uid != os.getuid():
            sock.close()
            raise socket_error(
                RendezvousError,
                info,
                role.mode,
                f"the node socket {path} is held by another user's process (uid {uid}, pid {pid})",
                "remove that process or socket",
            )
        sock.setblocking(False)
        return cls(sock, info, pid)

    def send(self, line: str, deadline: Deadline) -> bool:
        """Send one line to the leader; return False if it is gone."""
        return _send(self.sock, line, deadline)

    def receive(self, deadline: Deadline) -> str | None:
        """Return the leader's next line, or None if `deadline` passed; raise if it is gone.

        Raises:
            RendezvousError: The leader closed the connection (it died or gave up).
        """
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        try:
            while True:
                raw = self.lines.line()
                if raw is not None:
                    return raw.decode("utf-8", "replace")
                if self.lines.closed:
                    raise self.gone()
                if deadline.passed():
                    return None
                if selector.select(max(min(deadline.left(), 0.5), 0)):
                    self.lines.feed()
        finally:
            selector.close()

    def gone(self) -> RendezvousError:
        """Return the error of a member whose leader closed the connection."""
        info = self.info
        return RendezvousError(
            info.launcher,
            f"{info.who}: its node's leader (local rank 0, pid "
            f"{self.leader_pid}) closed its connection: it died, was stopped, or gave up",
            hint="the leader's log (or the launcher's exit codes) says why; rank 0's log names "
            "the ranks that did not check in",
        )

    def close(self) -> None:
        self.sock.close()
