"""The MPI transport of `distenv.master`'s exchange rule: rank 0's master, broadcast with mpi4py.

`distenv.master` decides *what* rank 0 publishes (its host name, mapped, and a free port); this
module only carries it, and checks first that mpi4py talks to the MPI library that started the
ranks. mpi4py is the optional extra ``distenv[mpi]``, imported only when an MPI job has no master.

**The contract.** `mpi_exchange` returns an `MpiExchange`: an `distenv.master.Exchange` (call it
on every rank with the function only rank 0 calls; it returns rank 0's ``(host, port)``) that also
keeps what it received. After the call, ``exchange.token`` holds 16 random bytes rank 0 drew with
`secrets` and sent with its master: the same on every rank of the job and different for every job,
for launchers that export no job identity (MPICH's Hydra); ``exchange.published`` holds the whole
`Published` payload. Both are None before the call.

**The wire.** One fixed-size buffer (`PAYLOAD`, 275 bytes: a status byte, the host's length, the
host in UTF-8 padded to 255 bytes, the port, the token), sent with ``Ibcast`` and polled with
``Test()`` between short sleeps, so the wait is Python code that can give up. Every rank decodes
and validates it like any other input (`decode`). When rank 0 cannot name its master it still
broadcasts, with a failure status, so its peers fail at once instead of waiting.

**The deadline.** Every MPI call here ends by `deadline` (a `distenv.deadline.Deadline`): by default the
rendezvous timeout (``DISTENV_TIMEOUT``, `distenv.settings.Settings.rendezvous_seconds`) plus
`distenv.timing.GRACE_S` (the bootstrap's one grace), counted from the start of the exchange;
`init_dist` may pass its own deadline instead. At the deadline a rank prints distenv's message
naming rank 0 and calls ``MPI_Abort``: a collective left pending would hang ``MPI_Finalize`` at
exit, and the job cannot go on without that rank anyway. SIGINT or SIGTERM during the wait prints
the message at once and ends the rank by that signal, as if distenv had no handler; its launcher
then ends the job (main thread only; the previous handlers come back afterwards).

MPI_Init itself (the import of ``mpi4py.MPI``) blocks until every rank has started MPI, holding the
GIL, so no Python code can bound it. When this module is the one to initialise MPI, a
`distenv.detection.kill_at_deadline.KillAtDeadline` helper forked just before covers MPI_Init and the
broadcast: `KILL_DELAY_S` after the deadline it prints the same message and kills the rank; the
launcher then ends the job. When MPI is already initialised (the program imported mpi4py first, or
passed `comm`) there is nothing to fork around, and nothing may be forked.
"""

from __future__ import annotations

import os
import secrets
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from distenv._hosts import check_hostname
from distenv.deadline import Deadline
from distenv.detection.kill_at_deadline import KillAtDeadline
from distenv.errors import (
    DistEnvError,
    InvalidVariableError,
    MasterResolutionError,
    RendezvousError,
    RendezvousTimeoutError,
)
from distenv.rankinfo import RankInfo
from distenv.settings import Settings
from distenv.timing import GRACE_S, KILL_DELAY_S

__all__ = [
    "ABI_HINT",
    "KILL_DELAY_S",
    "MPICH_RECIPE",
    "PAYLOAD",
    "TOKEN_BYTES",
    "MpiExchange",
    "Published",
    "decode",
    "encode",
    "exchange_deadline",
    "mpi_exchange",
]

#: How mpi4py loads MPICH's library on Debian/Ubuntu, which ship it as libmpich.so.12 only
#: (mpi4py's MPI4PY_MPIABI=mpich loads libmpi.so.12); tests/harness/setup.sh makes the same link.
MPICH_RECIPE = (
    "Or make mpi4py load MPICH's library: MPI4PY_MPIABI=mpich and a libmpi.so.12 first on "
    "LD_LIBRARY_PATH; Debian/Ubuntu ship it as libmpich.so.12 only, so link it: `mkdir -p "
    "~/mpich-lib && ln -sf \"$(/sbin/ldconfig -p | awk '/libmpich[.]so[.]12 /{print $NF; exit}')\" "
    "~/mpich-lib/libmpi.so.12`, then `mpiexec -genv MPI4PY_MPIABI mpich -genv LD_LIBRARY_PATH "
    "~/mpich-lib ...`"
)
ABI_HINT = (
    "mpi4py is talking to a different MPI library than the one that started the ranks. Simplest: "
    "give every rank the master so that no MPI call is needed (`mpiexec -genv MASTER_ADDR "
    "<rank 0's host> -genv MASTER_PORT <free port>`; `mpirun -x` under Open MPI). " + MPICH_RECIPE
)
LATE_HINT = (
    "export MASTER_ADDR and MASTER_PORT so that no MPI call is needed, or check rank 0's log "
    "(did it reach init_dist, or stall or crash before it?)"
)

TOKEN_BYTES = 16
HOST_BYTES = 255
#: status, host length, host (UTF-8, zero-padded), port, token: network byte order, 275 bytes.
PAYLOAD = struct.Struct(f">BB{HOST_BYTES}sH{TOKEN_BYTES}s")
_OK, _FAILED = 1, 2
# Test() polls: 0.5 ms, doubling up to 10 ms (measured: 1.2 ms in all when rank 0 is there).
_FIRST_PAUSE, _MAX_PAUSE = 0.0005, 0.01


@dataclass(frozen=True)
class Published:
    """What rank 0 broadcasts to every rank.

    Attributes:
        host: Rank 0's master host (at most 255 bytes of UTF-8).
        port: Rank 0's store port.
        token: 16 random bytes drawn by rank 0 for this job.
    """

    host: str
    port: int
    token: bytes


def encode(published: Published | None) -> bytearray:
    """Return the broadcast buffer for `published`; None says rank 0 failed to find its master.

    Raises:
        ValueError: If the host is longer than 255 bytes of UTF-8, the port is not in
            [1, 65535], or the token is not 16 bytes.
    """
    if published is None:
        return bytearray(PAYLOAD.pack(_FAILED, 0, b"", 0, bytes(TOKEN_BYTES)))
    host = published.host.encode()
    if not 0 < len(host) <= HOST_BYTES:
        raise ValueError(f"host {published.host!r} is not 1 to {HOST_BYTES} bytes of UTF-8")
    if not 0 < published.port <= 65535:
        raise ValueError(f"port {published.port!r} is not in [1, 65535]")
    if len(published.token) != TOKEN_BYTES:
        raise ValueError(f"token is {len(published.token)} bytes, expected {TOKEN_BYTES}")
    return bytearray(PAYLOAD.pack(_OK, len(host), host, published.port, published.token))


def decode(source: str, buffer: bytes | bytearray) -> Published:
    """Return what rank 0 published, validated (the buffer came from another process).

    Raises:
        MasterResolutionError: If rank 0 said it failed, or the buffer is not a valid payload.
    """
    if len(buffer) != PAYLOAD.size:
        raise _garbled(source, f"{len(buffer)} bytes, expected {PAYLOAD.size}")
    status, length, host, port, token = PAYLOAD.unpack(bytes(buffer))
    if status == _FAILED:
        raise MasterResolutionError(
            source,
            "rank 0 could not find its master address to send over MPI",
            hint="rank 0's log says why; or export MASTER_ADDR and MASTER_PORT",
        )
    if status != _OK:
        raise _garbled(source, f"status byte {status}")
    if not 0 < length <= HOST_BYTES or any(host[length:]):
        raise _garbled(source, f"host length {length}")
    try:
        text = host[:length].decode()
    except UnicodeDecodeError:
        raise _garbled(source, "a host that is not UTF-8") from None
    if port == 0:
        raise _garbled(source, "port 0")
    try:
        text = check_hostname(source, "MASTER_ADDR", text)
    except InvalidVariableError:
        raise _garbled(source, f"host {text!r}") from None
    return Published(text, port, token)


def _garbled(source: str, what: str) -> MasterResolutionError:
    return MasterResolutionError(
        source,
        f"the master rank 0 sent over MPI is malformed ({what})",
        hint="every rank must run the same distenv version; " + ABI_HINT,
    )


def exchange_deadline(settings: Settings) -> Deadline:
    """Return the deadline of an exchange starting now: the rendezvous timeout plus `GRACE_S`.

    Raises:
        ConfigurationError: If ``DISTENV_TIMEOUT`` is not a positive number of seconds.
    """
    return Deadline.after(settings.rendezvous_seconds(None) + GRACE_S)


def _late(info: RankInfo, seconds: float, where: str = "") -> RendezvousTimeoutError:
    """The error of a rank whose exchange did not finish by the deadline."""
    me = info.who
    if info.rank == 0:
        problem = f"{me}: could not send its master over MPI within {seconds:.0f} s{where}"
        hint = "a rank did not start MPI or crashed; check every rank's log"
    else:
        problem = f"{me}: rank 0 did not publish its master over MPI within {seconds:.0f} s{where}"
        hint = LATE_HINT
    return RendezvousTimeoutError(info.launcher, problem, hint=hint)


class MpiExchange:
    """An `distenv.master.Exchange` over MPI that keeps what rank 0 published (see the module).

    Attributes:
        info: This rank, as the launcher's variables describe it.
        comm: The communicator; None: ``MPI.COMM_WORLD``.
        deadline: When the exchange must end; None: computed from `settings` when the call
            starts (`exchange_deadline`).
        settings: The settings of that default; None: read from `os.environ` at the call.
        published: What rank 0 sent; None before the call.
    """

    def __init__(
        self,
        info: RankInfo,
        comm: Any = None,
        *,
        deadline: Deadline | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.info = info
        self.comm = comm
        self.deadline = deadline
        self.settings = settings
        self.published: Published | None = None

    @property
    def token(self) -> bytes | None:
        """The job's 16 random bytes from rank 0, the same on every rank; None before the call."""
        return None if self.published is None else self.published.token

    def __call__(self, rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        """Send rank 0's ``(host, port)`` to every rank; collective: every rank must call it.

        Raises:
            MasterResolutionError: mpi4py is missing or sees another world, or rank 0 failed.
            RendezvousTimeoutError: Only with a `comm` whose ``Abort`` returns (tests): the
                deadline passed (a real ``MPI_Abort`` ends the process first).
        """
        settings = Settings.read(os.environ) if self.settings is None else self.settings
        deadline = exchange_deadline(settings) if self.deadline is None else self.deadline
        comm, killer = self.comm, None
        if comm is None:
            if not _mpi_initialised(self.info):
                message = str(_late(self.info, deadline.seconds, " (MPI_Init did not return)"))
                killer = KillAtDeadline(deadline.later(KILL_DELAY_S), message)
                killer.start()
            try:
                comm = _comm_world(self.info)
            except BaseException:
                if killer is not None:
                    killer.stop()
                raise
        try:
            self.published = _exchange(self.info, comm, rank0_master, deadline)
        finally:
            if killer is not None:
                killer.stop()
        return self.published.host, self.published.port


def mpi_exchange(
    info: RankInfo,
    comm: Any = None,
    *,
    deadline: Deadline | None = None,
    settings: Settings | None = None,
) -> MpiExchange:
    """Return an `MpiExchange` that broadcasts rank 0's master over `comm` (``MPI.COMM_WORLD``).

    Collective: every rank of the job must call the exchange. After the call its ``token`` is
    the job's random token from rank 0.

    Args:
        info: This rank, as the launcher's variables describe it.
        comm: An mpi4py communicator; None: ``MPI.COMM_WORLD`` (MPI_Init, under `KillAtDeadline`).
        deadline: When every MPI call must have ended; None: the rendezvous timeout of
            `settings` plus `GRACE_S` from the call.
        settings: Where the default deadline's timeout comes from; None: `os.environ`.
    """
    return MpiExchange(info, comm, deadline=deadline, settings=settings)


def _no_mpi4py(info: RankInfo) -> MasterResolutionError:
    return MasterResolutionError(
        info.launcher,
        f"{info.who} has no MASTER_ADDR and mpi4py is not installed to ask rank 0 for its host",
        hint="pip install 'distenv[mpi]', or export MASTER_ADDR and MASTER_PORT",
    )


def _unloadable(info: RankInfo, exc: ImportError) -> MasterResolutionError:
    """Return the error for a failed import of mpi4py: not installed, or installed but broken.

    Only a missing mpi4py package is "not installed"; anything else (its MPI library missing,
    MPI4PY_MPIABI naming a library that is not there) is shown with its cause.
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name == "mpi4py":
        return _no_mpi4py(info)
    return MasterResolutionError(
        info.launcher,
        f"{info.who} has no MASTER_ADDR and mpi4py, which would ask "
        f"rank 0 for its host, cannot be loaded: {type(exc).__name__}: {exc}",
        hint="give every rank the master so that no MPI call is needed (`mpiexec -genv "
        "MASTER_ADDR <rank 0's host> -genv MASTER_PORT <free port>`; `mpirun -x` under Open "
        "MPI). " + MPICH_RECIPE,
    )


def _mpi_initialised(info: RankInfo) -> bool:
    """Return whether MPI is initialised already (only if mpi4py.MPI is loaded can it be)."""
    try:
        import mpi4py  # noqa: F401  (the package only: no MPI_Init)
    except ImportError as exc:
        raise _unloadable(info, exc) from exc
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and bool(mpi.Is_initialized())


def _comm_world(info: RankInfo) -> Any:
    """Import mpi4py.MPI (MPI_Init, unless done already) and return ``MPI.COMM_WORLD``."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise _unloadable(info, exc) from exc
    if not MPI.Is_initialized():  # mpi4py.rc.initialize = False
        MPI.Init()
    return MPI.COMM_WORLD


def _exchange(
    info: RankInfo,
    comm: Any,
    rank0_master: Callable[[], tuple[str, int]],
    deadline: Deadline,
) -> Published:
    """Check `comm`'s world, broadcast rank 0's payload and return it, decoded."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if (size, rank) != (info.world_size, info.rank):
        raise MasterResolutionError(
            info.launcher,
            f"mpi4py sees rank {rank} of {size}, but the launcher's variables say rank "
            f"{info.rank} of {info.world_size}",
            hint=ABI_HINT,
        )
    failure: BaseException | None = None
    buffer = bytearray(PAYLOAD.size)
    if rank == 0:
        try:
            host, port = rank0_master()
            buffer = encode(Published(host, port, secrets.token_bytes(TOKEN_BYTES)))
        except Exception as exc:  # whatever it is, the peers must not wait for it
            failure, buffer = exc, encode(None)  # tell the others, then raise here
    with _signals_noted() as caught:
        request = comm.Ibcast(buffer, root=0)
        pause = _FIRST_PAUSE
        while not request.Test():
            if caught:
                _die(comm, _interrupted(info, caught[0]), caught[0])
            left = deadline.left()
            if left <= 0:
                _abort(comm, _late(info, deadline.seconds), 1)
            time.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_PAUSE)
    if failure is not None:
        raise failure
    return decode(info.launcher, buffer)


def _interrupted(info: RankInfo, signum: int) -> RendezvousError:
    return RendezvousError(
        info.launcher,
        f"{info.who}: interrupted by {signal.Signals(signum).name} "
        "while waiting for rank 0's master over MPI",
        hint="the launcher ends the job; nothing to fix unless the signal was not intended",
    )


def _raise_signal(signum: int) -> None:
    """End this process by `signum`, as if no handler had been installed."""
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _die(comm: Any, error: DistEnvError, signum: int) -> NoReturn:
    """Print `error` as distenv's one line and die by `signum` (the launcher ends the others).

    Dying by the signal, not ``MPI_Abort``: a launcher that stops the job signals every rank, and
    a second abort racing the first only slows the teardown (Open MPI 4.1: 5 s, measured).
    """
    os.write(2, f"distenv: {error}\n".encode(errors="replace"))
    _raise_signal(signum)
    comm.Abort(128 + signum)  # still alive (the signal is blocked): abort instead
    raise error


def _abort(comm: Any, error: DistEnvError, code: int) -> NoReturn:
    """Print `error` as distenv's one line, ``MPI_Abort`` the job; raise it if Abort returns."""
    os.write(2, f"distenv: {error}\n".encode(errors="replace"))
    comm.Abort(code)
    raise error


@contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """Note SIGINT/SIGTERM in the yielded list instead of acting on them (main thread only)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def note(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
