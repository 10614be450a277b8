"""distenv.system.processes, the Linux process plumbing: the process table, live groups, parent death.

Real processes: each test starts small Python children and reads them back from /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from distenv.system.processes import (
    PDEATH_WRAPPER,
    PR_SET_PDEATHSIG,
    ThreadEntry,
    live_groups,
    processes,
    with_parent_death,
)
from tests.conftest import scrubbed_environ

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_the_process_table_shows_this_process_with_its_parent_and_group() -> None:
    """/proc/PID/stat is parsed into pid, state, parent and process group."""
    table = processes()
    assert table is not None
    (me,) = [p for p in table if p.pid == os.getpid()]
    assert (me.ppid, me.pgrp, me.dead) == (os.getppid(), os.getpgrp(), False)


def test_a_group_is_live_until_its_last_process_is_reaped() -> None:
    """A child in its own session is a live group; once it is killed and reaped it is not."""
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        assert live_groups({child.pid, 1 << 22}) == {child.pid}
    finally:
        child.kill()
        child.wait()
    assert live_groups({child.pid}) == set()


def test_the_wrapper_asks_for_the_parent_death_signal_then_runs_the_command() -> None:
    """The exec wrapper carries the prctl number from PR_SET_PDEATHSIG and execs the command."""
    assert f".prctl({PR_SET_PDEATHSIG}, signal.SIGKILL" in PDEATH_WRAPPER
    command = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "c"]
    result = subprocess.run(
        with_parent_death(command, os.getpid(), "tester"),
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "['a b', 'c']\n", "")


def test_the_wrapper_names_a_command_it_cannot_execute() -> None:
    """A missing program: the wrapper says so as `who` and exits 127, as a shell does."""
    result = subprocess.run(
        with_parent_death(["/nonexistent/program"], os.getpid(), "tester"),
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 127
    assert result.stderr == (
        "tester: cannot execute '/nonexistent/program': No such file or directory\n"
    )


def test_the_wrapper_kills_itself_when_the_parent_it_was_given_is_not_its_parent() -> None:
    """A parent that died before prctl took effect: the rank ends by SIGKILL, never runs."""
    result = subprocess.run(
        with_parent_death([sys.executable, "-c", "print('ran')"], 1 << 22, "tester"),
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout) == (-signal.SIGKILL, "")


def test_parent_death_signal_says_whether_the_parent_is_still_there() -> None:
    """True for the real parent (the request stands), False for a pid that is not the parent."""
    code = textwrap.dedent(
        """
        import os
        from distenv.system.processes import parent_death_signal
        print(parent_death_signal(os.getppid()), parent_death_signal(1 << 22))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "True False\n"), result.stderr


def test_the_thread_table_lists_this_process_threads_with_their_system_calls() -> None:
    """`threads` sees this process's threads: the reader running, a sleeper blocked in futex(2)."""
    import threading
    import time

    from distenv.system.processes import threads

    def asleep(thread: ThreadEntry) -> bool:
        return thread.state == "S" and thread.syscall.split()[:1] in ([b"202"], [b"98"])  # futex

    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait, name="sleeper")
    sleeper.start()
    try:
        until = time.monotonic() + 10  # the sleeper may take a moment to block
        while True:
            found = threads()
            assert found is not None
            if any(asleep(thread) for thread in found) or time.monotonic() > until:
                break
            time.sleep(0.01)
    finally:
        stop.set()
        sleeper.join()
    assert len(found) >= 2
    assert any(thread.state == "R" for thread in found)  # the one reading the table
    assert any(asleep(thread) for thread in found)
