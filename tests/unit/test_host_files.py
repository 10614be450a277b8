"""Host files detection reads (PBS's node file, LSF's host and rank files): regular files only.

A FIFO with no writer used to hang `init_dist` for ever (issue #25): the path is now looked at
without being opened, and anything but a regular file is refused at once, naming the variable.
A read that blocks (a hung network file system) is bounded: tests/process/test_host_files.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from distenv import detect
from distenv._hosts import MAX_HOST_FILE_BYTES, read_host_file
from distenv.errors import InvalidVariableError
from tests.support.envs import lsf, pbs


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A FIFO nobody writes to: opening it for reading would block for ever."""
    path = tmp_path / "nodefile"
    os.mkfifo(path)
    return path


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    """A listening Unix socket's path."""
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        yield path


def _refused(path: Path | str, what: str) -> InvalidVariableError:
    with pytest.raises(InvalidVariableError) as caught:
        read_host_file("pbs", "PBS_NODEFILE", str(path), "node file")
    error = caught.value
    assert (error.source, error.variable, error.value) == ("pbs", "PBS_NODEFILE", str(path))
    assert str(error).startswith(
        f"pbs: $PBS_NODEFILE is {str(path)!r}, expected a node file: a regular file, one host "
        f"per slot, not {what}"
    ), error
    assert "Hint: the scheduler sets $PBS_NODEFILE to the node file it writes" in str(error)
    return error


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    """One host per slot, in order, whatever the white space; through a symbolic link too."""
    path = tmp_path / "nodefile"
    path.write_text("x1\nx1\n  x2\tx3\n")
    assert read_host_file("pbs", "PBS_NODEFILE", str(path), "node file") == ["x1", "x1", "x2", "x3"]
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_host_file("pbs", "PBS_NODEFILE", str(link), "node file") == ["x1", "x1", "x2", "x3"]


def test_a_fifo_is_refused_without_waiting_for_a_writer(fifo: Path) -> None:
    """A FIFO is never opened: refused at once (0.1.0 blocked in open() for ever)."""
    error = _refused(fifo, "a FIFO (named pipe)")
    assert "which would block until something writes to it" in str(error)


def test_a_symbolic_link_to_a_fifo_is_refused(fifo: Path, tmp_path: Path) -> None:
    """The link is followed, and what it names is judged."""
    link = tmp_path / "link"
    link.symlink_to(fifo)
    _refused(link, "a FIFO (named pipe)")


@pytest.mark.parametrize(
    ("path", "what"),
    [
        pytest.param("/dev/zero", "a character device", id="dev-zero"),
        pytest.param("/dev/null", "a character device", id="dev-null"),
        pytest.param("/", "a directory", id="directory"),
    ],
)
def test_devices_and_directories_are_refused(path: str, what: str) -> None:
    """/dev/zero would be read up to the cap, /dev/null read as empty: both refused as devices."""
    _refused(path, what)


def test_a_socket_is_refused(unix_socket: Path) -> None:
    """A Unix socket's path names no file to read."""
    _refused(unix_socket, "a socket")


def test_missing_file_and_too_large_file(tmp_path: Path) -> None:
    """A missing file names the system's reason; a file past the cap is refused unread."""
    with pytest.raises(InvalidVariableError, match=r"a readable node file \(No such file"):
        read_host_file("pbs", "PBS_NODEFILE", str(tmp_path / "absent"), "node file")
    big = tmp_path / "big"
    with big.open("wb") as file:
        file.truncate(MAX_HOST_FILE_BYTES + 1)
    with pytest.raises(InvalidVariableError, match="a node file under 16 MiB"):
        read_host_file("pbs", "PBS_NODEFILE", str(big), "node file")


def test_detection_refuses_each_launchers_host_file_naming_its_variable(fifo: Path) -> None:
    """PBS's node file, LSF's blaunch host file and jsrun rank file: each names its variable."""
    cases = [
        ("pbs", {**pbs.PBS_SCRIPT, "PBS_NODEFILE": str(fifo)}, "PBS_NODEFILE"),
        ("auto", {**lsf.BLAUNCH_2X2[1], "LSB_DJOB_HOSTFILE": str(fifo)}, "LSB_DJOB_HOSTFILE"),
        ("auto", {**lsf.JSRUN_PLAIN_RANK5, "LSB_DJOB_RANKFILE": "/dev/zero"}, "LSB_DJOB_RANKFILE"),
    ]
    for launcher, env, variable in cases:
        with pytest.raises(InvalidVariableError) as caught:
            detect(launcher, env)
        assert caught.value.variable == variable
        assert "a regular file" in str(caught.value)
