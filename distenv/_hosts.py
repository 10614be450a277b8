"""Host lists and tasks-per-node lists, read safely.

Nodelists (``node[001-003,005]``, ``rack[1-2]-node[3-4]``) are expanded by python-hostlist, imported
only here and only when a list with ranges is read (a list without brackets is split here). Before
anything is expanded the string is checked against the hostlist alphabet and its host count is
computed from the brackets, so a 30-byte value that names a billion hosts is refused instead of
eating the node's memory.

Host files (`read_host_file`, `read_host_text`) are read only if they are regular files, and under a bound: a FIFO
with no writer, a device, or a file on a hung network file system must not stall detection. Within
one detection (`host_files`, entered by the pipeline) each file is read once, and all of them
within one deadline: a launcher asks for its rank file for the layout and again for the master,
and on a slow file system each read had its own bound.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from distenv.deadline import Deadline, bounded
from distenv.errors import InvalidVariableError
from distenv.timing import HOST_FILE_S

__all__ = [
    "MAX_HOSTS",
    "check_hostname",
    "count_hosts",
    "expand_nodelist",
    "expand_tasks_per_node",
    "host_files",
    "read_host_file",
    "read_host_text",
    "record_host",
    "this_host",
]

# Larger than any machine built so far; a list past it is corrupt or hostile.
MAX_HOSTS = 100_000

_HOST_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_LIST_CHARS = re.compile(r"[A-Za-z0-9._\-\[\],]+")
# Bounded: a node number of more digits is no host's, and int() refuses past 4300 digits.
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")
_TASKS_ITEM = re.compile(r"([0-9]{1,7})(?:\(x([0-9]{1,7})\))?")


# A scheduler's host file (LSF's rank and host files, PBS's node file) lists one host per slot; a
# file larger than this is not a host list.
MAX_HOST_FILE_BYTES = 16 * 1024 * 1024

_CHUNK = 64 * 1024  # read in pieces: os.read allocates all it is asked for, first

# What a host file's path may name instead of a regular file (stat(2)'s S_IFMT), for errors.
_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe), which would block until something writes to it",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class _NotRegularError(Exception):
    """The path names something other than a regular file; the text says what."""


class _ExpiredError(Exception):
    """The read did not return by its deadline."""


class _Reads:
    """The host files of one detection: the deadline of all their reads, and each one's outcome."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.outcomes: dict[str, bytes | Exception] = {}


_READS: ContextVar[_Reads | None] = ContextVar("distenv_host_file_reads", default=None)


@contextmanager
def host_files(within: float = HOST_FILE_S) -> Iterator[None]:
    """Read each host file once while the body runs, all of them within `within` seconds from now.

    A later read of a path returns the first one's text, or raises its error again at once. Nested
    uses share the outermost one's reads and deadline.
    """
    if _READS.get() is not None:
        yield
        return
    token = _READS.set(_Reads(Deadline.after(within)))
    try:
        yield
    finally:
        _READS.reset(token)


def _outcome(path: str, within: float) -> tuple[bytes | Exception, Deadline]:
    """Return the read of `path` (its bytes, or the exception it raised) and the deadline it had."""
    reads = _READS.get()
    deadline = Deadline.after(within) if reads is None else reads.deadline
    if reads is not None and path in reads.outcomes:
        return reads.outcomes[path], deadline

    def expired() -> _ExpiredError:
        return _ExpiredError()

    outcome: bytes | Exception
    try:
        outcome = bounded(lambda: _read_regular(path, MAX_HOST_FILE_BYTES + 1), deadline, expired)
    except (_NotRegularError, _ExpiredError, OSError) as exc:
        outcome = exc
    if reads is not None:
        reads.outcomes[path] = outcome
    return outcome, deadline


def read_host_file(
    launcher: str, variable: str, path: str, kind: str, *, within: float = HOST_FILE_S
) -> list[str]:
    """Return the host names of the file `path` (named by `variable`), one per slot, in order.

    Reads the file as `read_host_text` does and checks every name; `kind` names the file in
    errors ("node file").

    Raises:
        InvalidVariableError: As `read_host_text`, or if the file holds no host names.
    """
    text = read_host_text(launcher, variable, path, kind, within=within)
    hosts = [check_hostname(launcher, variable, h) for h in text.split()]
    if not hosts:
        raise InvalidVariableError(launcher, variable, path, f"a {kind} naming at least one host")
    return hosts


def read_host_text(
    launcher: str,
    variable: str,
    path: str,
    kind: str,
    *,
    within: float = HOST_FILE_S,
    shape: str = "one host per slot",
) -> str:
    """Return the text of the scheduler's file `path` (named by `variable`), read safely.

    Reads at most 16 MiB of a regular file; `kind` names the file in errors ("node file"). The
    whole read, from the path's lookup on, runs in a thread abandoned after `within` seconds
    (`distenv.timing.HOST_FILE_S`; tests shorten it), or at the deadline of the detection's
    `host_files`, whose read of the same path it reuses: on a network file system whose server
    does not answer, even a stat blocks, and no signal ends it. Bytes that are no UTF-8 are
    replaced (the caller's parser refuses them). `shape` says what the file holds, in errors.

    Raises:
        InvalidVariableError: If the path names no regular file (a FIFO, a device, a directory,
            a socket), the file cannot be read, is too large, or its read has not returned
            within its deadline (stated in the message).
    """
    data, deadline = _outcome(path, within)
    if isinstance(data, _ExpiredError):
        raise InvalidVariableError(
            launcher,
            variable,
            path,
            f"a {kind} that can be read within {deadline.seconds:g} s; reading it did not "
            "return, as on a hung network file system",
            hint="check the file system that holds it on this node (a `stat` of the path hangs "
            f"too when its server does not answer), or point ${variable} at a copy on a local disk",
        )
    if isinstance(data, _NotRegularError):
        raise InvalidVariableError(
            launcher,
            variable,
            path,
            f"a {kind}: a regular file, {shape}, not {data}",
            hint=f"the scheduler sets ${variable} to the {kind} it writes: correct or remove "
            "whatever overrides it",
        )
    if isinstance(data, OSError):
        raise InvalidVariableError(launcher, variable, path, f"a readable {kind} ({data.strerror})")
    assert isinstance(data, bytes)
    if len(data) > MAX_HOST_FILE_BYTES:
        raise InvalidVariableError(launcher, variable, path, f"a {kind} under 16 MiB")
    return data.decode("utf-8", "replace")


def _read_regular(path: str, limit: int) -> bytes:
    """Return up to `limit` bytes of the regular file `path`.

    The path is first opened with ``O_PATH``, which opens nothing: opening a FIFO for reading
    would wait for a writer, and opening a device runs its driver (a tape drive rewinds). Only a
    regular file is then opened for reading, through ``/proc/self/fd``, which reopens the very
    file checked even if the path has been replaced since.

    Raises:
        _NotRegularError: If `path` names something else; the text says what.
        OSError: If it cannot be opened or read.
    """
    anchor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        mode = os.fstat(anchor).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegularError(_NOT_REGULAR.get(stat.S_IFMT(mode), "a special file"))
        fd = os.open(f"/proc/self/fd/{anchor}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(anchor)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, min(limit - size, _CHUNK))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# RFC 1123 (section 2.1) and RFC 1035 (section 2.3.4): a host name has at most 253 characters
# (without the root's trailing dot), each dot-separated label 1 to 63.
MAX_NAME_CHARS = 253
MAX_LABEL_CHARS = 63


def _name_fits(name: str) -> bool:
    """Return whether `name` keeps RFC 1123's limits: 253 characters, labels of 1 to 63."""
    name = name[:-1] if name.endswith(".") else name
    return 0 < len(name) <= MAX_NAME_CHARS and all(
        0 < len(label) <= MAX_LABEL_CHARS for label in name.split(".")
    )


def _is_ipv6(text: str) -> bool:
    """Return whether `text` is an IPv6 address, with or without a zone (``fe80::1%eth0``)."""
    if not re.fullmatch(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]{1,64})?", text):
        return False
    import ipaddress  # only for an address with colons: detection seldom sees one

    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def check_hostname(launcher: str, variable: str, value: str, *, hint: str | None = None) -> str:
    """Return `value` if it is a plain host name or address, else raise `InvalidVariableError`.

    Accepts names within RFC 1123's limits (253 characters, labels of 1 to 63), IPv4 and IPv6
    addresses (``[`` ``]`` stripped); refuses spaces, shell metacharacters, ``host:port`` and
    anything else that has no business in a host name. Every launcher's host names pass here.
    """
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    if ":" in bare:
        if _is_ipv6(bare):
            return bare
        expected = "a host name or address (an IPv6 address, if it has colons; no port)"
    elif _HOST_CHARS.fullmatch(bare):
        if _name_fits(bare):
            return bare
        expected = (
            f"a host name of at most {MAX_NAME_CHARS} characters, each dot-separated label "
            f"1 to {MAX_LABEL_CHARS} (RFC 1123)"
        )
    else:
        expected = "a host name or address"
    raise InvalidVariableError(launcher, variable, value, expected, hint=hint)


# What a host name keeps as is in the bootstrap's records (distenv.bootstrap.records' "hostname"
# pattern, which also admits the escapes `record_host` writes).
_PLAIN_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_PLAIN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def record_host(name: str) -> str:
    """Return host name `name` as the bootstrap's records and messages carry it.

    The kernel accepts any bytes as a host name (up to 64: a space, a non-ASCII letter, ``@``, a
    tab), and Python decodes them as the file system's names (UTF-8, undecodable bytes escaped).
    A name of letters, digits, ``.``, ``_`` and ``-`` (every name a scheduler or DNS gives) is
    kept as is; any other is percent-encoded byte by byte (``my node`` -> ``my%20node``,
    ``nœud`` -> ``n%C5%93ud``, the empty name -> ``%``), so that every rank writes and compares
    the same printable string, the state records' ``@`` and ``#`` and the node socket's tabs stay
    separators, and no name can pass for another (a plain name holds no ``%``, and the escape is
    reversible: ``urllib.parse.unquote(..., errors="surrogateescape")``).
    """
    if _PLAIN_HOST.fullmatch(name):
        return name
    if not name:
        return "%"
    return "".join(
        char
        if char in _PLAIN_CHARS and (i or char not in ".-")
        else "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogateescape"))
        for i, char in enumerate(name)
    )


def this_host() -> str:
    """Return this host's name as the bootstrap's records carry it (`record_host`): the one
    owner of the name every rank reports, records with its state, and compares."""
    import socket

    return record_host(socket.gethostname())


def _split_top_level(text: str) -> list[str] | None:
    """Split at commas outside brackets; None when brackets do not balance or nest."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                return None
        elif char == "]":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        return None
    items.append(text[start:])
    return items


def count_hosts(value: str) -> int | None:
    """Return how many hosts a nodelist names, without expanding it; None if it is malformed."""
    items = _split_top_level(value)
    if items is None:
        return None
    total = 0
    for item in items:
        if not item:
            return None
        count = 1
        # A name without brackets is one host: no pattern to compile (~0.1 ms, once per process).
        for group in re.findall(r"\[([^\]]*)\]", item) if "[" in item else ():
            width = 0
            for part in group.split(","):
                match = _RANGE.fullmatch(part)
                if match is None:
                    return None
                low = int(match.group(1))
                high = int(match.group(2)) if match.group(2) is not None else low
                if high < low:
                    return None
                width += high - low + 1
            count *= width
            if count > MAX_HOSTS:
                return count
        total += count
        if total > MAX_HOSTS:
            return total
    return total


def expand_nodelist(launcher: str, variable: str, value: str) -> list[str]:
    """Expand a Slurm-style nodelist into host names, in order.

    Raises:
        InvalidVariableError: If the list is malformed, carries characters outside the hostlist
            alphabet, or names more than `MAX_HOSTS` hosts.
    """
    expected = "a nodelist such as 'node[001-004,007]'"
    if not _LIST_CHARS.fullmatch(value):
        raise InvalidVariableError(
            launcher, variable, value, expected + " (letters, digits, '.', '_', '-', '[', ']', ',')"
        )
    count = count_hosts(value)
    if count is None or count == 0:
        raise InvalidVariableError(launcher, variable, value, expected)
    if count > MAX_HOSTS:
        raise InvalidVariableError(
            launcher, variable, value, f"at most {MAX_HOSTS} hosts (it names {count})"
        )
    if "[" in value:
        import hostlist  # python-hostlist; imported only when a list has ranges to expand

        try:
            hosts: list[str] = hostlist.expand_hostlist(value)
        except hostlist.BadHostlist as exc:
            raise InvalidVariableError(launcher, variable, value, f"{expected} ({exc})") from None
    else:
        # No ranges (one node, or names listed): the names, each once, in order, as
        # python-hostlist returns them (count_hosts refused empty ones), without importing it:
        # 0.3 to 0.4 ms of each rank's CPU on a one-node srun job (bench_bootstrap.py --profile).
        hosts = list(dict.fromkeys(value.split(",")))
    # An expanded name is never longer than the list that made it: short lists need no check.
    if len(value) > MAX_LABEL_CHARS:
        for host in hosts:
            if not _name_fits(host):
                check_hostname(launcher, variable, host)  # raises, naming the host
    return hosts


def expand_tasks_per_node(launcher: str, variable: str, value: str) -> list[int]:
    """Expand Slurm's compressed tasks-per-node list: ``'2(x3),1'`` becomes ``[2, 2, 2, 1]``.

    Raises:
        InvalidVariableError: If an item is malformed or the list would exceed `MAX_HOSTS` nodes.
    """
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if match is None:
            raise InvalidVariableError(
                launcher, variable, value, "a tasks-per-node list such as '4(x2),3'"
            )
        tasks = int(match.group(1))
        repeat = int(match.group(2)) if match.group(2) is not None else 1
        if tasks < 1 or repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise InvalidVariableError(
                launcher,
                variable,
                value,
                f"positive task counts on at most {MAX_HOSTS} nodes",
            )
        counts.extend([tasks] * repeat)
    return counts
