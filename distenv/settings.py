"""distenv's runtime settings: declared like the launchers' variables, read once per entry point.

Each entry point (`init_dist`, `setup`, `distenv doctor`, `distenv run`, `launch`, detection) reads
a `Settings` from its environment once and hands it down; nothing below it looks at os.environ for
these names. The docs render `SETTINGS` (docs/contract.md), so the table cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from distenv.errors import ConfigurationError, quoted, shown
from distenv.exits import DEBUG_VAR
from distenv.variables import Reader, Var

if TYPE_CHECKING:
    import datetime
    from typing import TypeAlias

    #: A timeout argument: seconds, or a timedelta.
    Timeout: TypeAlias = float | datetime.timedelta

__all__ = [
    "AGENT_STORE_VAR",
    "CPU_BINDING_VAR",
    "DEBUG_VAR",
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "HANG_VAR",
    "LEADERS_VAR",
    "LEADER_MODES",
    "LOG_DIR_VAR",
    "MAX_SECONDS",
    "OMP_VAR",
    "PLUGINS_VAR",
    "RESTART_VAR",
    "SECONDS",
    "SETTINGS",
    "TIMEOUT_VAR",
    "Settings",
    "seconds",
]

TIMEOUT_VAR = "DISTENV_TIMEOUT"
HANG_VAR = "DISTENV_HANG_TIMEOUT"
LOG_DIR_VAR = "DISTENV_LOG_DIR"
PLUGINS_VAR = "DISTENV_PLUGINS"
# torchrun's agent hosts the store on MASTER_PORT itself when this is "True" (torch compares it to
# str(True): torch/distributed/rendezvous.py, _create_c10d_store); workers then only connect.
AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_VAR = "TORCHELASTIC_RESTART_COUNT"
OMP_VAR = "OMP_NUM_THREADS"
LEADERS_VAR = "DISTENV_NODE_LEADERS"
CPU_BINDING_VAR = "DISTENV_CPU_BINDING"
#: The values ``DISTENV_NODE_LEADERS`` takes (`distenv.bootstrap.leaders`).
LEADER_MODES = ("auto", "on", "off")

#: The longest timeout or period distenv accepts, in seconds: a year. Past it the value breaks
#: below distenv, each way its own: at 1e10 s torch's store client times out at once, at 1e13 s
#: gloo refuses it as negative ("enforce fail ... Invalid timeout"), past 8.6e13 s
#: datetime.timedelta overflows, and past 9.2e9 s (threading.TIMEOUT_MAX) a thread's wait raises
#: OverflowError.
MAX_SECONDS = 365 * 24 * 3600.0
#: What a timeout setting or argument must be, as the refusals say it.
SECONDS = f"a positive number of seconds, at most {MAX_SECONDS:.0f} (a year)"

#: Seconds every rank may take to reach rank 0's store, when neither the argument nor
#: ``DISTENV_TIMEOUT`` says otherwise (TCPStore's own default).
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0

SETTINGS = (
    Var(
        TIMEOUT_VAR,
        "rendezvous timeout",
        "no",
        "seconds a rank may take to reach rank 0's store and check in (init_dist: 300; "
        f"doctor: 60; at most {MAX_SECONDS:.0f}, a year); the rendezvous_timeout= argument wins",
    ),
    Var(
        HANG_VAR,
        "distenv run",
        "no",
        "seconds a rank may make no progress before every rank's stacks are compared, the rank "
        "whose stack differs is named and the job ends with status 124 (distenv run, or "
        "init_dist under any launcher); --hang-timeout and hang_timeout= win (docs: failures)",
    ),
    Var(
        LOG_DIR_VAR,
        "init_dist",
        "no",
        "a folder (shared by the job's nodes) where each rank keeps its output in rank-N.log and "
        "its failure in rank-N.report and rank-N.fault (the hang autopsy's stacks too); "
        "`distenv why DIR` reads them; the log_dir= argument wins (docs: failures)",
    ),
    Var(
        PLUGINS_VAR,
        "auto detection",
        "no",
        "comma-separated plug-in launchers to try first (docs: detection, plug-ins)",
    ),
    Var(
        AGENT_STORE_VAR,
        "the store",
        "no",
        "'True' under torchrun: its agent hosts the store and every rank, rank 0 included, connects",
    ),
    Var(
        RESTART_VAR,
        "store keys",
        "no",
        "torchrun's restart number: the keys of one attempt are never read by the next",
    ),
    Var(
        DEBUG_VAR,
        "errors",
        "no",
        "1: an error from a public call raises with distenv's whole traceback instead of "
        "ending the script in one line per rank (docs: errors)",
    ),
    Var(
        LEADERS_VAR,
        "the roll call",
        "no",
        "auto (the default): where ranks share a node, its local rank 0 batches its node's "
        "roll call in worlds of 256 ranks or more; on: in every world; off: never (docs: scale)",
    ),
    Var(
        CPU_BINDING_VAR,
        "init_dist, setup, distenv run",
        "no",
        "bind each local rank's CPUs: node, socket, exclusive, core-complex (torchrun's "
        "--numa-binding) or auto; none (the default) binds nothing; the cpu_binding= argument "
        "and --numa-binding win (docs: placement)",
    ),
    Var(
        OMP_VAR,
        "distenv run, launch(), cpu binding",
        "no",
        "unless you set it: the cores each rank is bound to, or, unbound with several ranks on a "
        "node, the cores they may use shared among them (at least 1)",
    ),
)


def _within(number: float) -> bool:
    """Return whether `number` seconds is a timeout distenv accepts (`SECONDS`)."""
    import math  # here: detection imports this module and never needs it

    return math.isfinite(number) and 0 < number <= MAX_SECONDS


def seconds(value: object, name: str) -> float:
    """Return the argument `value` (seconds or a timedelta) as seconds, or raise naming it.

    Raises:
        ConfigurationError: If `value` is not a number of seconds in `SECONDS` (one line naming
            the argument, its value and the range).
    """
    import datetime  # here: detection imports this module and never needs it

    result = float("nan")
    if isinstance(value, datetime.timedelta):
        result = value.total_seconds()
    elif isinstance(value, int) and not isinstance(value, bool):
        if 0 < value <= MAX_SECONDS:  # compared first: float() of an int past 1e308 raises
            result = float(value)
    elif isinstance(value, float):
        result = value
    if not _within(result):
        raise ConfigurationError(
            "init",
            f"{name}={quoted(value)} is invalid, expected {SECONDS}",
            hint=f"pass {name} as seconds (e.g. 600) or a datetime.timedelta",
        )
    return result


class Settings(NamedTuple):
    """The runtime settings of one entry point, as read from its environment.

    Values are kept as read; each is validated where it is used, so that a bad
    ``DISTENV_TIMEOUT`` is an error only when no ``rendezvous_timeout=`` overrides it.

    Attributes:
        timeout: ``DISTENV_TIMEOUT`` as written, or None.
        plugins: The plug-in names of ``DISTENV_PLUGINS``, in order.
        agent_store: Whether torchrun's agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``).
        restart: torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``), ``"0"`` when unset.
        omp_num_threads: ``OMP_NUM_THREADS`` as written, or None.
        node_leaders: ``DISTENV_NODE_LEADERS`` as written (`LEADER_MODES`), ``"auto"`` when unset.
        hang_timeout: ``DISTENV_HANG_TIMEOUT`` as written, or None.
        log_dir: ``DISTENV_LOG_DIR`` as written, or None.
        cpu_binding: ``DISTENV_CPU_BINDING`` as written, or None.
    """

    timeout: str | None = None
    plugins: tuple[str, ...] = ()
    agent_store: bool = False
    restart: str = "0"
    omp_num_threads: str | None = None
    node_leaders: str = "auto"
    hang_timeout: str | None = None
    log_dir: str | None = None
    cpu_binding: str | None = None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Settings:
        """Read every setting from `env` (empty values count as unset)."""
        reader = Reader("distenv", env, SETTINGS)
        plugins = (reader.get(PLUGINS_VAR) or "").split(",")
        return cls(
            timeout=reader.get(TIMEOUT_VAR),
            plugins=tuple(name.strip() for name in plugins if name.strip()),
            agent_store=reader.get(AGENT_STORE_VAR) == str(True),
            restart=reader.get(RESTART_VAR) or "0",
            omp_num_threads=reader.get(OMP_VAR),
            node_leaders=(reader.get(LEADERS_VAR) or "auto").strip().lower(),
            hang_timeout=reader.get(HANG_VAR),
            log_dir=reader.get(LOG_DIR_VAR),
            cpu_binding=reader.get(CPU_BINDING_VAR),
        )

    def rendezvous_seconds(
        self, argument: Timeout | None, default: float = DEFAULT_RENDEZVOUS_TIMEOUT
    ) -> float:
        """Return the rendezvous timeout: `argument`, else ``$DISTENV_TIMEOUT``, else `default`.

        Raises:
            ConfigurationError: If the one that applies is not a number of seconds in `SECONDS`,
                naming it, its value and the range.
        """
        if argument is not None:
            return seconds(argument, "rendezvous_timeout")
        if self.timeout is None:
            return default
        return _read_seconds(
            "init",
            TIMEOUT_VAR,
            self.timeout,
            f"export {TIMEOUT_VAR}=600, or unset it for {default:g} s",
        )

    def hang_seconds(self, argument: float | None, who: str = "distenv run") -> float | None:
        """Return the hang timeout: `argument` (``--hang-timeout``, ``hang_timeout=``), else
        ``$DISTENV_HANG_TIMEOUT``; `who` reads it (the refusal names it).

        Raises:
            ConfigurationError: If ``$DISTENV_HANG_TIMEOUT`` applies and is not a number of
                seconds in `SECONDS`, naming its value and the range.
        """
        if argument is not None or self.hang_timeout is None:
            return argument
        hint = f"export {HANG_VAR}=300 (longer than your slowest step), or unset it"
        return _read_seconds(who, HANG_VAR, self.hang_timeout, hint)


def _read_seconds(launcher: str, name: str, text: str, hint: str) -> float:
    """Return the setting `name`'s value `text` as seconds in `SECONDS`, or raise naming it."""
    try:
        value = float(text)  # '9' * 5000 reads as inf: refused below
    except ValueError:
        value = float("nan")
    if not _within(value):
        raise ConfigurationError(
            launcher,
            f"${name} is {shown(text)}, expected {SECONDS}",
            hint=hint,
            variable=name,
            value=text,
        )
    return value
