"""`KillAtDeadline`, the GIL-free deadline helper: it kills a stuck process with a message, and
leaves no trace otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from distenv.deadline import Deadline
from distenv.detection.kill_at_deadline import KillAtDeadline
from tests.conftest import scrubbed_environ


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def gone(pid: int, within: float) -> bool:
    """Whether process `pid` has exited and been reaped (or is a zombie) within `within` s."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def test_stopped_in_time_the_helper_leaves_and_is_reaped() -> None:
    """Stopped before its deadline, the helper exits and is reaped; this process lives on."""
    helper = KillAtDeadline(Deadline.after(30), "never printed")
    helper.start()
    pid = helper.pid
    assert pid is not None
    helper.stop()
    until = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < until:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{pid}"), "helper not reaped"
    helper.stop()  # idempotent


def test_at_the_deadline_it_prints_the_message_and_kills_the_process() -> None:
    """A process stuck past the deadline (here: a sleep) is SIGKILLed after one stderr line."""
    start = time.monotonic()
    result = run_python(
        """
        import time
        from distenv.deadline import Deadline
        from distenv.detection.kill_at_deadline import KillAtDeadline
        KillAtDeadline(Deadline.after(0.5), "mpi: rank 1 of 4: stuck. Hint: look").start()
        time.sleep(20)
        """
    )
    took = time.monotonic() - start
    assert result.returncode == -signal.SIGKILL, result
    assert result.stderr == "distenv: mpi: rank 1 of 4: stuck. Hint: look\n"
    assert took < 5


def test_the_helper_never_runs_the_parents_exit_code() -> None:
    """atexit handlers and buffered output run once (the parent's), never in the helper."""
    result = run_python(
        """
        import atexit, sys, time
        from distenv.deadline import Deadline
        from distenv.detection.kill_at_deadline import KillAtDeadline
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("buffered ")
        with KillAtDeadline(Deadline.after(30), "never printed"):
            time.sleep(0.2)
        """
    )
    assert result.returncode == 0, result
    assert result.stdout == "buffered atexit ran\n"
    assert result.stderr == ""


def test_the_helper_dies_with_its_parent() -> None:
    """SIGKILL of the parent takes the helper with it (PR_SET_PDEATHSIG), and no pipe stays open."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from distenv.deadline import Deadline\n"
            "from distenv.detection.kill_at_deadline import KillAtDeadline\n"
            "dog = KillAtDeadline(Deadline.after(60), 'never printed')\n"
            "dog.start()\n"
            "print(dog.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        env=scrubbed_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        assert os.path.exists(f"/proc/{helper}")
        proc.kill()
        _, err = proc.communicate(timeout=5)  # EOF at once: the helper holds no pipe of ours
        assert err == ""
        assert gone(helper, within=2), "helper survived its parent"
    finally:
        proc.kill()
        proc.wait()
