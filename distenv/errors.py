"""The one exception hierarchy of distenv.

Every message follows one template so that a user reading a job log at 3 a.m. sees who complained,
about which variable, what it held, and what to do::

    slurm: $SLURM_PROCID is 'x', expected an integer. Hint: start one task per GPU with srun

The attributes (`source`, `variable`, `value`, `hint`) carry the same facts for programs. `source`
is the launcher backend that found the problem (``slurm``, ``mpi``, ...) or the component
(``init``, ``run``, ``launch``, ``rendezvous``, ...); `launcher` is its older, read-only alias.
`consequence` tells a failure another rank caused from a refusal (`DistEnvError`).

The tree, which a caller catches at the level it can act on (checked against the classes by
``tests/unit/test_errors.py``)::

    DistEnvError                        anything distenv refuses, with source, variable, value, hint
    ├── MissingVariableError            a variable the launcher needs is unset
    ├── InvalidVariableError            a variable's value cannot be right
    ├── InconsistentEnvironmentError    variables contradict each other
    ├── NotLaunchedError                the batch script, not one of the job's tasks
    ├── StrippedEnvironmentError        a launcher started it, but its variables were removed
    ├── LauncherNotFoundError           the named launcher is unknown or absent
    ├── LauncherMismatchError           the named launcher describes an outer layer
    ├── ConfigurationError              an argument or DISTENV_* setting is invalid
    ├── MasterResolutionError           no master address or port
    ├── InitError                       torch.distributed could not start as asked
    ├── RendezvousError                 the ranks met, but the start-up cannot go on
    │   ├── RollCallError               the roll call's verdict: the ranks do not add up
    │   ├── RendezvousTimeoutError      not every rank arrived in time
    │   └── StoreTakenError             the master's port holds another job's store
    ├── RequeueError                    the job could not be requeued
    └── WorkerFailedError               a worker of `distenv.launch` failed
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DistEnvError",
    "InconsistentEnvironmentError",
    "InitError",
    "InvalidVariableError",
    "LauncherMismatchError",
    "LauncherNotFoundError",
    "MasterResolutionError",
    "MissingVariableError",
    "NotLaunchedError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "RequeueError",
    "RollCallError",
    "StoreTakenError",
    "StrippedEnvironmentError",
    "WorkerFailedError",
]

#: The logger distenv's warnings go to.
LOGGER = "distenv"

# How many characters of a value a message quotes: a corrupt or hostile variable may hold megabytes,
# and an error is one line of a job log.
SHOWN_CHARS = 120


def shown(value: str) -> str:
    """Return `value` quoted for a message (``!r``), its middle elided past `SHOWN_CHARS`.

    For distenv's own messages (not in `__all__`, which lists the public error classes).
    """
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    half = SHOWN_CHARS // 2
    return f"{value[:half]!r}...{value[-half:]!r} ({len(value)} characters)"


def quoted(value: object) -> str:
    """Return an argument's value for a message: its ``repr``, elided past `SHOWN_CHARS`.

    An int of more than 4300 digits has no ``repr`` (Python 3.11's limit raises ValueError): it
    is described by its size instead. For distenv's own messages, as `shown`.
    """
    if isinstance(value, int) and value.bit_length() > 64:
        sign = "a negative" if value < 0 else "an"
        return f"<{sign} integer of {value.bit_length()} bits>"
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[: SHOWN_CHARS // 2]}...{text[-SHOWN_CHARS // 2 :]} ({len(text)} characters)"


def warn(message: str, *args: object) -> None:
    """Log `message` % `args` as a warning on the ``distenv`` logger (`LOGGER`).

    For the rare warnings of detection (a batch script running as rank 0 of 1, stale exported
    MASTER_*): `logging` is imported only then, since importing it would cost every ``import
    distenv`` about 2 ms.
    """
    import logging

    logging.getLogger(LOGGER).warning(message, *args)


class DistEnvError(Exception):
    """Base of every error distenv raises on purpose.

    Attributes:
        source: The launcher backend (``slurm``, ``mpi``, ...) or the component (``init``,
            ``run``, ...) that found the problem; it starts the message.
        variable: The environment variable at fault, if one is.
        value: The offending value, verbatim, if there is one.
        hint: The fix, in one sentence.
        consequence: Whether it follows from another rank's failure (a lost store, a peer gone
            from a collective), which another attempt may not meet: the first-failure card
            counts it as a consequence, and ``distenv run --max-restarts`` retries it. Else it
            is a refusal, which a restart repeats. Each class says which it is; a raise site may
            say otherwise (``consequence=``).
    """

    consequence = False

    def __init__(
        self,
        source: str,
        problem: str,
        *,
        hint: str | None = None,
        variable: str | None = None,
        value: str | None = None,
        consequence: bool | None = None,
    ) -> None:
        if consequence is not None:
            self.consequence = consequence
        self.source = source
        self.problem = problem
        self.hint = hint
        self.variable = variable
        self.value = value
        #: ``(launcher, verdict)`` lines of the detection that failed, for `distenv doctor`.
        self.considered: tuple[tuple[str, str], ...] = ()
        message = f"{source}: {problem}"
        if hint:
            message += f". Hint: {hint}"
        super().__init__(message)

    @property
    def launcher(self) -> str:
        """The older name of `source`, kept for programs written against 0.1 (read-only)."""
        return self.source


class MissingVariableError(DistEnvError):
    """A variable the launcher needs is unset (or empty, which counts as unset)."""

    def __init__(self, source: str, variable: str, *, hint: str | None = None) -> None:
        super().__init__(source, f"${variable} is not set", hint=hint, variable=variable)


class InvalidVariableError(DistEnvError):
    """A variable is set but its value cannot be right (not an integer, malformed list, ...)."""

    def __init__(
        self, source: str, variable: str, value: str, expected: str, *, hint: str | None = None
    ) -> None:
        super().__init__(
            source,
            f"${variable} is {shown(value)}, expected {expected}",
            hint=hint,
            variable=variable,
            value=value,
        )


class InconsistentEnvironmentError(DistEnvError):
    """Variables are well-formed one by one but contradict each other (rank >= world size, ...)."""


class NotLaunchedError(DistEnvError):
    """The process belongs to a multi-task job but was not started as one of its tasks.

    The classic case is a Slurm batch script (or salloc shell) of a 4-task job running the training
    script itself: it would be "rank 0 of 4" and wait forever for three ranks nobody started.
    """


class StrippedEnvironmentError(DistEnvError):
    """A launcher started this process, but none of its variables reach it.

    A container run with ``apptainer exec --cleanenv`` or ``ch-run --unset-env`` hides them: run
    alone, every task would be "rank 0 of 1" and train by itself.
    """


class LauncherNotFoundError(DistEnvError):
    """An explicitly named launcher is unknown or its variables are absent."""


class LauncherMismatchError(DistEnvError):
    """The named launcher's variables describe an outer layer, not the process that runs."""


class ConfigurationError(DistEnvError):
    """An argument or a distenv setting (DISTENV_*) is invalid."""


class MasterResolutionError(DistEnvError):
    """The master address or port could not be found (MPI without MASTER_ADDR, ...)."""


class InitError(DistEnvError):
    """torch.distributed could not be initialised as asked."""

    consequence = True


class RendezvousError(DistEnvError):
    """The ranks met, but the start-up could not go on: rank 0's store or a node's leader went
    away, a node has no route to the master, ranks were started for two world sizes, a record in
    the store was not written by this job, or a signal interrupted a wait (its subclasses say the
    rest)."""

    consequence = True


class RollCallError(RendezvousError):
    """The roll call's verdict refused the job: what the ranks reported does not add up (two
    processes of one rank, ranks disagreeing, two ranks on one GPU, a layout their launcher
    misstated). Every rank raises it alike; no restart mends it, so it is a refusal, not a failure
    another rank caused."""

    consequence = False


class RendezvousTimeoutError(RendezvousError):
    """Not every rank arrived (or the master could not be reached) within the timeout."""


class StoreTakenError(RendezvousError):
    """The store at the master's port belongs to another job (or is no distenv store at all)."""


class RequeueError(DistEnvError):
    """The job could not be requeued: no scheduler to ask, or its command failed."""


class WorkerFailedError(DistEnvError):
    """A worker started by `distenv.launch` raised or died; the other workers were stopped.

    Attributes:
        rank: Global rank of the first worker that failed.
        exitcode: Its exit status (negative: the signal that killed it), or None if it raised.
        traceback: Its formatted traceback, if it raised.
    """

    consequence = True

    def __init__(
        self,
        source: str,
        rank: int,
        problem: str,
        *,
        exitcode: int | None = None,
        traceback: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(source, problem, hint=hint)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.traceback:
            text += f"\n\nTraceback of rank {self.rank}:\n{self.traceback.rstrip()}"
        return text
