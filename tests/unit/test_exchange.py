"""The MPI exchange's wire format and deadline, over a fake communicator (real MPI: integration)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distenv.deadline import Deadline
from distenv.detection.exchange import (
    ABI_HINT,
    MPICH_RECIPE,
    PAYLOAD,
    TOKEN_BYTES,
    MpiExchange,
    Published,
    _unloadable,
    decode,
    encode,
    exchange_deadline,
    mpi_exchange,
)
from distenv.errors import MasterResolutionError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.settings import Settings

# Host names within RFC 1123's limits (`distenv._hosts.check_hostname`): labels of 1 to 63.
LABELS = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
HOSTS = st.lists(LABELS.filter(lambda label: 0 < len(label) <= 63), min_size=1, max_size=5).map(
    ".".join
)


def rank(r: int, world: int = 4) -> RankInfo:
    """Rank `r` of an mpirun job on one node, master unknown."""
    return RankInfo(
        launcher="mpi",
        rank=r,
        world_size=world,
        local_rank=r,
        local_world_size=world,
        node_rank=0,
        num_nodes=1,
        master_addr=None,
        master_port=None,
    )


class Wire:
    """What a fake broadcast carries: rank 0's buffer once rank 0 has sent it."""

    def __init__(self) -> None:
        self.sent: bytes | None = None


class Request:
    """A fake MPI request: done once rank 0 has sent (and then the buffer is filled)."""

    def __init__(self, wire: Wire, buffer: bytearray, on_test: Any = None) -> None:
        self.wire, self.buffer, self.on_test, self.tests = wire, buffer, on_test, 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        if self.on_test is not None:
            self.on_test(self)
        if self.wire.sent is None:
            return False
        self.buffer[:] = self.wire.sent
        return True


class Comm:
    """A fake mpi4py communicator for one rank, sharing `wire` with the others."""

    def __init__(self, wire: Wire, r: int, size: int = 4, on_test: Any = None) -> None:
        self.wire, self.r, self.size, self.on_test = wire, r, size, on_test
        self.aborted: int | None = None
        self.requests: list[Request] = []

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return self.r

    def Ibcast(self, buffer: bytearray, root: int = 0) -> Request:  # noqa: N802
        assert root == 0
        assert len(buffer) == PAYLOAD.size
        if self.r == 0:
            self.wire.sent = bytes(buffer)
        request = Request(self.wire, buffer, self.on_test)
        self.requests.append(request)
        return request

    def Abort(self, code: int) -> None:  # noqa: N802
        self.aborted = code


def rank0_master() -> tuple[str, int]:
    return "node-7", 4711


def never_called() -> tuple[str, int]:
    raise AssertionError("only rank 0 may compute the master")


@given(
    host=HOSTS.filter(lambda h: len(h) <= 253),
    port=st.integers(1, 65535),
    token=st.binary(min_size=TOKEN_BYTES, max_size=TOKEN_BYTES),
)
def test_payload_round_trips(host: str, port: int, token: bytes) -> None:
    """Any valid host (up to 255 bytes), port and token decode to what was encoded."""
    buffer = encode(Published(host, port, token))
    assert len(buffer) == PAYLOAD.size == 275
    assert decode("mpi", buffer) == Published(host, port, token)


@given(st.binary(min_size=PAYLOAD.size, max_size=PAYLOAD.size))
def test_decode_refuses_garbage_with_a_distenv_error(buffer: bytes) -> None:
    """Arbitrary bytes decode to a valid payload or a MasterResolutionError, nothing else."""
    try:
        published = decode("mpi", buffer)
    except MasterResolutionError as exc:
        message = str(exc)
    else:
        message = ""
        assert 0 < len(published.host.encode()) <= 255
        assert 1 <= published.port <= 65535
        assert len(published.token) == TOKEN_BYTES
    assert message == "" or message.startswith("mpi: ")


@pytest.mark.parametrize(
    ("buffer", "problem"),
    [
        pytest.param(b"\x01" * 10, "10 bytes, expected 275", id="short"),
        pytest.param(PAYLOAD.pack(9, 1, b"a", 1, bytes(16)), "status byte 9", id="status"),
        pytest.param(PAYLOAD.pack(1, 0, b"", 1, bytes(16)), "host length 0", id="no-host"),
        pytest.param(PAYLOAD.pack(1, 1, b"ab", 1, bytes(16)), "host length 1", id="padding"),
        pytest.param(PAYLOAD.pack(1, 2, b"\xff\xfe", 1, bytes(16)), "not UTF-8", id="utf8"),
        pytest.param(PAYLOAD.pack(1, 3, b"a b", 1, bytes(16)), "host 'a b'", id="space"),
        pytest.param(PAYLOAD.pack(1, 1, b"a", 0, bytes(16)), "port 0", id="port-0"),
    ],
)
def test_decode_names_what_is_malformed(buffer: bytes, problem: str) -> None:
    """A malformed payload is refused, saying what is wrong and what to check."""
    with pytest.raises(MasterResolutionError) as caught:
        decode("mpi", buffer)
    assert problem in str(caught.value)
    assert "the master rank 0 sent over MPI is malformed" in str(caught.value)
    assert "same distenv version" in str(caught.value.hint)


@pytest.mark.parametrize(
    "published",
    [
        pytest.param(Published("h" * 256, 1, bytes(16)), id="host-256-bytes"),
        pytest.param(Published("é" * 128, 1, bytes(16)), id="host-256-utf8-bytes"),
        pytest.param(Published("", 1, bytes(16)), id="no-host"),
        pytest.param(Published("h", 0, bytes(16)), id="port-0"),
        pytest.param(Published("h", 65536, bytes(16)), id="port-65536"),
        pytest.param(Published("h", 1, bytes(15)), id="short-token"),
    ],
)
def test_encode_refuses_what_does_not_fit(published: Published) -> None:
    """Rank 0 refuses to send a payload the others could not decode."""
    with pytest.raises(ValueError, match=r"host|port|token"):
        encode(published)


def test_every_rank_gets_rank0_master_and_one_random_token() -> None:
    """Rank 0 computes, every rank returns its (host, port); the token is shared and random."""
    wire = Wire()
    deadline = Deadline.after(5)
    exchanges = [mpi_exchange(rank(r), Comm(wire, r), deadline=deadline) for r in range(4)]
    assert all(isinstance(e, MpiExchange) and e.token is None for e in exchanges)
    answers = [exchanges[0](rank0_master)] + [e(never_called) for e in exchanges[1:]]
    assert answers == [("node-7", 4711)] * 4
    tokens = {e.token for e in exchanges}
    assert len(tokens) == 1
    (token,) = tokens
    assert len(token or b"") == TOKEN_BYTES
    assert all(e.published == Published("node-7", 4711, token) for e in exchanges)
    again = Wire()
    other = mpi_exchange(rank(0), Comm(again, 0), deadline=deadline)
    other(rank0_master)
    assert other.token != token  # a new draw for every job


def test_world_mismatch_is_explained() -> None:
    """mpi4py seeing another world than the launcher (wrong MPI library) is named, with the fix."""
    exchange = mpi_exchange(rank(1), Comm(Wire(), 0, size=1), deadline=Deadline.after(5))
    with pytest.raises(MasterResolutionError) as caught:
        exchange(never_called)
    assert "mpi4py sees rank 0 of 1, but the launcher's variables say rank 1 of 4" in str(
        caught.value
    )
    assert caught.value.hint == ABI_HINT


def test_rank0_failure_is_sent_so_peers_fail_at_once() -> None:
    """When rank 0 cannot name its master it says so over MPI: peers fail now, not at the deadline."""
    wire = Wire()

    def broken() -> tuple[str, int]:
        raise MasterResolutionError("mpi", "no master here")

    with pytest.raises(MasterResolutionError, match="no master here"):
        mpi_exchange(rank(0), Comm(wire, 0), deadline=Deadline.after(60))(broken)
    start = time.monotonic()
    with pytest.raises(MasterResolutionError) as caught:
        mpi_exchange(rank(2), Comm(wire, 2), deadline=Deadline.after(60))(never_called)
    assert time.monotonic() - start < 1
    assert "rank 0 could not find its master address to send over MPI" in str(caught.value)


def test_deadline_prints_the_message_and_aborts(capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 0 never sends: at the deadline the rank prints distenv's line and calls MPI_Abort."""
    comm = Comm(Wire(), 2)
    start = time.monotonic()
    exchange = mpi_exchange(rank(2), comm, deadline=Deadline.after(0.3))
    with pytest.raises(RendezvousTimeoutError) as caught:
        exchange(never_called)
    took = time.monotonic() - start
    assert 0.3 <= took < 0.5
    assert comm.aborted == 1
    message = str(caught.value)
    assert message.startswith("mpi: rank 2 of 4: rank 0 did not publish its master over MPI within")
    assert "export MASTER_ADDR and MASTER_PORT" in message
    assert "rank 0's log" in message
    assert capfd.readouterr().err == f"distenv: {message}\n"
    assert comm.requests[0].tests > 5  # polled, not blocked


def test_default_deadline_is_the_rendezvous_timeout_plus_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No deadline given: DISTENV_TIMEOUT (of the settings) + 10 s from the start of the call."""
    before = time.monotonic()
    deadline = exchange_deadline(Settings.read({"DISTENV_TIMEOUT": "3"}))
    assert deadline.seconds == 13.0
    assert before + 13.0 <= deadline.at <= time.monotonic() + 13.0
    assert exchange_deadline(Settings()).seconds == 310.0
    monkeypatch.setattr(
        "distenv.detection.exchange.GRACE_S", 0.5
    )  # the name exchange_deadline reads
    exchange = mpi_exchange(
        rank(1), Comm(Wire(), 1), settings=Settings.read({"DISTENV_TIMEOUT": "0.2"})
    )
    start = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match="within 1 s"):
        exchange(never_called)
    assert 0.7 <= time.monotonic() - start < 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_waiting_ends_the_rank_at_once(
    signum: signal.Signals, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT/SIGTERM during the wait: a message, then death by that signal; handlers restored.

    (Here the death is recorded instead, so the fallback MPI_Abort(128 + n) is reached.)
    """
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    died: list[int] = []
    monkeypatch.setattr("distenv.detection.exchange._raise_signal", died.append)

    def interrupt(request: Request) -> None:
        if request.tests == 3:
            os.kill(os.getpid(), signum)

    comm = Comm(Wire(), 3, on_test=interrupt)
    start = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        mpi_exchange(rank(3), comm, deadline=Deadline.after(60))(never_called)
    assert time.monotonic() - start < 1
    assert died == [signum]
    assert comm.aborted == 128 + signum
    assert f"rank 3 of 4: interrupted by {signum.name} while waiting for rank 0" in str(
        caught.value
    )
    assert capfd.readouterr().err == f"distenv: {caught.value}\n"
    assert {s: signal.getsignal(s) for s in before} == before


def test_missing_mpi4py_is_not_installed() -> None:
    """Only a missing mpi4py package reads "not installed", with the install hint."""
    error = _unloadable(rank(1), ModuleNotFoundError("No module named 'mpi4py'", name="mpi4py"))
    assert str(error) == (
        "mpi: rank 1 of 4 has no MASTER_ADDR and mpi4py is not installed to ask rank 0 for its "
        "host. Hint: pip install 'distenv[mpi]', or export MASTER_ADDR and MASTER_PORT"
    )


def test_unloadable_mpi4py_shows_its_cause_and_the_debian_recipe() -> None:
    """mpi4py installed but unable to load its MPI library: the cause is shown, not "not installed".

    The hint gives the master first (no MPI call at all), then the link Debian needs.
    """
    cause = ImportError("libmpi.so.12: cannot open shared object file", name="MPI")
    error = _unloadable(rank(1), cause)
    assert "not installed" not in str(error)
    assert error.problem == (
        "rank 1 of 4 has no MASTER_ADDR and mpi4py, which would ask rank 0 for its host, cannot "
        "be loaded: ImportError: libmpi.so.12: cannot open shared object file"
    )
    assert error.hint is not None
    assert error.hint.startswith("give every rank the master so that no MPI call is needed")
    assert error.hint.index("-genv MASTER_ADDR") < error.hint.index("libmpich.so.12")
    assert MPICH_RECIPE in error.hint
