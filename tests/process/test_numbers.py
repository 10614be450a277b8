"""Numbers of any size, in any variable or argument, end in one line naming it (#44 items 9, 11, 13).

Real processes: a rank under torchrun's contract calling `init_dist`, and the ``distenv`` command.
Out of range used to mean a traceback from below distenv: ``DISTENV_TIMEOUT=1e14`` a 35-line
`OverflowError` from `datetime.timedelta`, ``1e13`` gloo's "enforce fail" naming no variable, a
``RANK`` of 5000 digits a 52-line `ValueError` (Python's 4300-digit limit on ``int()``) raised
while the real error was being formatted, ``distenv run --ranks 0-100000000000`` a set of 10**11
ranks (a MemoryError under a memory limit, the node's memory without one).
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from distenv.errors import ConfigurationError
from tests.conftest import scrubbed_environ
from tests.support.envs import slurm
from tests.support.spawn import REPO, contract_env, free_port

HUGE = "9" * 5000
WITHIN = "a positive number of seconds, at most 31536000 (a year)"
# A rank that calls init_dist with the keyword arguments given as Python source in argv[1].
RANK = "import sys, distenv\ndistenv.init_dist(backend='gloo', **eval(sys.argv[1]))\n"


def _rank(env: dict[str, str], arguments: str = "{}") -> subprocess.CompletedProcess[str]:
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", RANK, arguments],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("value", ["1e13", "1e14", "31536001", HUGE, "inf"])
def test_an_out_of_range_timeout_variable_is_refused_naming_it(value: str) -> None:
    """``DISTENV_TIMEOUT`` past a year: one line naming it, its value and the range (item 9)."""
    env = contract_env(0, 1, free_port(), extra={"DISTENV_TIMEOUT": value})
    line = _one_line(_rank(env))
    quoted = (
        repr(value) if len(value) < 100 else f"{value[:60]!r}...{value[-60:]!r} (5000 characters)"
    )
    assert f"init: $DISTENV_TIMEOUT is {quoted}, expected {WITHIN}" in line, line


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ("{'rendezvous_timeout': 1e14}", "rendezvous_timeout=100000000000000.0"),
        ("{'rendezvous_timeout': 10**5000}", "rendezvous_timeout=<an integer of 16610 bits>"),
        ("{'timeout': 1e13}", "timeout=10000000000000.0"),
        ("{'timeout': __import__('datetime').timedelta(days=10**6)}", "timeout=datetime.timedelta"),
    ],
)
def test_an_out_of_range_timeout_argument_is_refused_naming_it(arguments: str, shown: str) -> None:
    """The same for the arguments, whatever their type: an int past 1e308 too (item 9)."""
    line = _one_line(_rank(contract_env(0, 1, free_port()), arguments))
    assert f"init: {shown}" in line, line
    assert f"is invalid, expected {WITHIN}" in line, line


@pytest.mark.parametrize("option", ["--grace-period", "--monitor-interval", "--restart-backoff"])
def test_an_out_of_range_period_option_is_a_usage_error(option: str) -> None:
    """distenv run's periods: past a year a usage error naming the option (Python's waits
    overflow past 9.2e9 s)."""
    done = subprocess.run(
        [sys.executable, "-m", "distenv", "run", option, "1e14", "x.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"distenv run: error: argument {option}/"), done.stderr
    assert last.endswith(": '1e14' is not a number of seconds in [0, 31536000] (a year)"), last


@pytest.mark.parametrize("variable", ["RANK", "SLURM_PROCID"])
def test_a_rank_of_5000_digits_ends_in_one_line_naming_it(variable: str) -> None:
    """A rank variable of 5000 digits: the rank's one line names it (0.2.0.dev: 52 lines of a
    ValueError raised while the line was being written) (item 11)."""
    if variable == "RANK":
        env = {**contract_env(0, 2, free_port()), "RANK": HUGE}
    else:
        env = {**scrubbed_environ(), **slurm.SRUN_1N_4T[1], "SLURM_PROCID": HUGE}
    line = _one_line(_rank(env))
    assert line.startswith("<string>:2: distenv.errors.InvalidVariableError: "), line
    assert f"${variable} is '9999" in line, line
    assert "(5000 characters), expected an integer in [0, 10000000]" in line, line


def _run_limited(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``distenv run ARGS`` with 1 GiB of address space at most (the launcher needs ~50 MiB)."""
    limit = 1 << 30
    return subprocess.run(
        [sys.executable, "-m", "distenv", "run", *args],
        env=scrubbed_environ(), cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )  # fmt: skip


def test_a_rank_range_past_the_world_is_refused_without_building_it() -> None:
    """``--ranks 0-100000000000`` is refused in one line naming the first rank outside the world,
    within 1 GiB (item 13); numbers of any size as options end in their one usage line."""
    done = _run_limited("-n", "2", "--ranks", "1,0-100000000000", "--no-python", "true")
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "distenv: run: --ranks names rank 2, but the world has 2 ranks. Hint: choose among 0 to 1\n"
    )
    for option in ("-n", "--nnodes", "--max-restarts", "--master-port", "--ranks"):
        done = _run_limited(option, HUGE, "x.py")
        assert done.returncode == 2, done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"distenv run: error: argument {option}"), last
        assert "(5000 characters) is not " in last, last
        assert len(last) < 400, last


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ({"grace_period": 1e14}, "grace_period=100000000000000.0 is not a number of seconds"),
        ({"timeout": 10**5000}, "timeout=<an integer of 16610 bits> is invalid"),
        ({"nprocs": 10**5000}, "nprocs=<an integer of 16610 bits>, expected an int in [1, "),
    ],
    ids=["grace_period", "timeout", "nprocs"],
)
def test_launch_refuses_out_of_range_arguments_before_any_worker(
    arguments: dict[str, object], shown: str
) -> None:
    """launch()'s numbers, refused in one line before a worker starts (a grace period past
    9.2e9 s overflowed its joins; a huge count started workers) (item 9, 11)."""
    import distenv

    options: dict[str, object] = {"nprocs": 1, **arguments}
    with pytest.raises(ConfigurationError) as caught:
        distenv.launch(print, **options)  # type: ignore[call-overload]
    assert shown in str(caught.value), caught.value
    assert "\n" not in str(caught.value)
