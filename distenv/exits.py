"""How a `DistEnvError` from a public call reaches the user: one line per rank, no traceback.

A refusal raised by `init_dist`, `setup`, `launch`, `requeue` or `watch_preemption` names the
launcher, the variable, its value and the fix in its message. Printed by Python as an uncaught
exception it came under 20 to 30 lines of distenv's own frames, once per rank: four ranks under
mpirun printed ~110 lines with the fix on the last line of each block. `one_line` makes the
error that leaves a public call also a `SystemExit` whose code is one line::

    rank 2: train.py:12: distenv.errors.NotLaunchedError: slurm: ... Hint: ...

Its hint's example command quotes the job's own script and size (`distenv.hints`).

Python prints a `SystemExit`'s text code to stderr, with no traceback, and exits 1; the error is
still an instance of its own class, so ``except DistEnvError`` (or ``except Exception``, or
``pytest.raises``) catches it as before. No global ``sys.excepthook`` is installed, which would
fight rich, IPython or Lightning's own.

`ExitStatus` tells the teardown at exit (`distenv.bootstrap.teardown`), which must sometimes end the
process itself, which status Python was about to end it with, without any hook of its own either.

The plain exception, with distenv's whole traceback, is raised instead where a `SystemExit`
would be wrong or unwelcome: with ``DISTENV_DEBUG=1``, outside the main thread (a thread drops a
`SystemExit` silently), and in interactive sessions (``python -i``, IPython), where a traceback
is wanted and an exit is not.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, ParamSpec, TypeVar, cast

from distenv.errors import DistEnvError, NotLaunchedError
from distenv.hints import reword

__all__ = ["DEBUG_VAR", "ExitStatus", "OneLine", "line", "one_line", "rank_of"]

#: Set to 1 for the plain exception and distenv's whole traceback.
DEBUG_VAR = "DISTENV_DEBUG"
#: Variables that hold this process's global rank under the launchers that start ranks (read only
#: to prefix the line: the rank may be unknown when detection itself failed).
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep
#: SystemExit's own ``code`` slot, under `OneLine.code`.
_SYSTEM_EXIT_CODE: Any = SystemExit.__dict__["code"]

P = ParamSpec("P")
R = TypeVar("R")


class ExitStatus:
    """The status this process is ending with, read from what Python leaves at exit.

    - An uncaught exception: Python sets ``sys.last_value`` before it calls ``sys.excepthook``, so
      whatever hook the script or a library installed, it reads as 1 (a KeyboardInterrupt as
      Python's own end by SIGINT).
    - An uncaught `OneLine`: Python reads a `SystemExit`'s ``code`` exactly when it exits with it,
      and `OneLine.code` notes that read: status 1, its code being a line of text.
    - ``sys.exit(code)`` in the main thread: `watch` wraps ``sys.exit`` (a thread's call ends only
      that thread and is not counted).

    A bare ``raise SystemExit(code)`` of the script's own is not seen and reads as 0, as does a
    ``sys.exit`` taken with ``from sys import exit`` before `watch`; code that catches a `OneLine`
    and reads its ``code`` counts as its exit.
    """

    _exit: int = 0  # from sys.exit(), main thread
    _read: int | None = None  # a OneLine's code, read as Python exits with it
    _ending: BaseException | None = None  # that OneLine
    _watching: bool = False

    @classmethod
    def watch(cls) -> None:
        """Start recording ``sys.exit`` calls (once per process, however often this is called)."""
        if cls._watching:
            return
        cls._watching = True
        previous_exit = sys.exit

        def exit_(status: Any = None) -> None:
            if threading.current_thread() is threading.main_thread():
                cls._exit = code_of(status)
            previous_exit(status)

        sys.exit = exit_  # type: ignore[assignment]

    @classmethod
    def status(cls) -> int:
        """Return the status, or ``-SIGINT`` where Python would end the process by SIGINT."""
        last = getattr(sys, "last_value", None)
        if last is not None and not hasattr(sys, "ps1"):  # at a prompt it is the last error shown
            return -signal.SIGINT if isinstance(last, KeyboardInterrupt) else 1
        return cls._exit if cls._read is None else cls._read

    @classmethod
    def error(cls) -> BaseException | None:
        """Return the exception this process is ending with: uncaught, or a refusal's `OneLine`."""
        last = getattr(sys, "last_value", None)
        if last is not None and not hasattr(sys, "ps1"):
            return cast(BaseException, last)
        return cls._ending if cls._read is not None else None

    @classmethod
    def describe(cls) -> str:
        """Return how the process is ending, for a message: ``status 1`` or ``SIGINT``."""
        status = cls.status()
        return f"status {status}" if status >= 0 else signal.Signals(-status).name

    @classmethod
    def end_now(cls) -> None:
        """End the process at once (``os._exit``) as Python would have: flush, then the status."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # None, closed, EPIPE
                stream.flush()
        status = cls.status()
        if status < 0:
            signal.signal(-status, signal.SIG_DFL)
            os.kill(os.getpid(), -status)
            status = 128 - status  # the signal was blocked: the shell's way to say it
        os._exit(status)


def code_of(status: object) -> int:
    """Return the process status Python gives ``sys.exit(status)``."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # a message: printed to stderr, status 1


class OneLine(SystemExit):
    """The `SystemExit` side of an error that leaves a public call: its code is its line."""

    @property  # type: ignore[override]
    def code(self) -> object:
        """The line; Python reads it when it exits with this error, and `ExitStatus` notes it."""
        line = _SYSTEM_EXIT_CODE.__get__(self)
        if threading.current_thread() is threading.main_thread():
            ExitStatus._read = code_of(line)
            ExitStatus._ending = self
        return line

    @code.setter
    def code(self, line: object) -> None:
        _SYSTEM_EXIT_CODE.__set__(self, line)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (multiprocessing, torch.multiprocessing) as the plain error it extends.
        plain = type(self).__mro__[1]
        return (_restore, (plain, self.args, dict(self.__dict__)))


def _restore(plain: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = plain.__new__(plain)
    error.args = args
    error.__dict__.update(state)
    return error


_HYBRIDS: dict[type[DistEnvError], type[DistEnvError]] = {}


def _converted(error: DistEnvError, code: str) -> DistEnvError:
    """Return `error` as an instance of its class's `OneLine` subclass, with `code`."""
    plain = type(error)
    hybrid = _HYBRIDS.get(plain)
    if hybrid is None:
        hybrid = type(plain.__name__, (plain, OneLine), {"__module__": plain.__module__})
        hybrid.__qualname__ = plain.__qualname__
        _HYBRIDS[plain] = hybrid
    converted = hybrid.__new__(hybrid)
    converted.args = error.args
    converted.__dict__.update(error.__dict__)
    cast(OneLine, converted).code = code
    return converted


def rank_of(env: Mapping[str, str]) -> int | None:
    """Return the global rank a launcher put in `env` (`RANK_VARS`), None where none did."""
    for name in RANK_VARS:
        value = env.get(name, "")
        # At most 9 digits: int() of over 4300 raises, here while a real error is being told.
        if value.isascii() and value.isdigit() and len(value) <= 9:
            return int(value)
    return None


def _caller() -> str | None:
    """Return ``file:line`` of the innermost frame outside distenv: where the user called it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return None
    path = frame.f_code.co_filename
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        shown = path
    return f"{path if shown.startswith('..') else shown}:{frame.f_lineno}"


def line(error: DistEnvError, where: str | None, rank: int | None) -> str:
    """Return the line that stands for `error`, raised at `where` on `rank` (both if known)."""
    plain = type(error).__mro__[1] if isinstance(error, OneLine) else type(error)
    text = f"{plain.__module__}.{plain.__qualname__}: {error}"
    if where:
        text = f"{where}: {text}"
    if rank is None or rank == 0:
        text += f" ({DEBUG_VAR}=1 shows the traceback)"
    return text if rank is None else f"rank {rank}: {text}"


def _plain_wanted(env: Mapping[str, str]) -> bool:
    if env.get(DEBUG_VAR, "").strip().lower() not in ("", "0", "false", "no"):
        return True
    if threading.current_thread() is not threading.main_thread():
        return True
    if sys.flags.interactive or sys.flags.inspect or hasattr(sys, "ps1"):
        return True
    # An IPython shell or kernel is running (a library may import IPython in a plain script).
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


def one_line(function: Callable[P, R]) -> Callable[P, R]:
    """Make a `DistEnvError` that leaves `function` end the program in one line (module doc)."""

    @functools.wraps(function)
    def public(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except DistEnvError as error:
            if isinstance(error, OneLine):
                raise
            # Its example command in the job's own words: the script and the world's size.
            reword(error, sys.argv, os.environ)
            if _plain_wanted(os.environ):
                raise
            # A process refused as not launched (a batch script) is no rank of anything.
            rank = None if isinstance(error, NotLaunchedError) else rank_of(os.environ)
            converted = _converted(error, line(error, _caller(), rank))
            # Chained to the original: code that catches and prints it still sees where it came from.
            raise converted from error

    return public
