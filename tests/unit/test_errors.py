"""DistEnvError names its source (a launcher or a component); `launcher` is a read-only alias."""

from __future__ import annotations

import re

import pytest

from distenv import DistEnvError, detect, errors
from distenv.errors import (
    ConfigurationError,
    InvalidVariableError,
    MissingVariableError,
    WorkerFailedError,
)


@pytest.mark.parametrize(
    "error",
    [
        DistEnvError("init", "went wrong", hint="fix it"),
        MissingVariableError("slurm", "SLURM_PROCID"),
        ConfigurationError("run", "bad flag"),
        WorkerFailedError("launch", 3, "rank 3 raised"),
    ],
    ids=["base", "missing", "configuration", "worker"],
)
def test_source_starts_the_message_and_launcher_is_its_alias(error: DistEnvError) -> None:
    """`source` is what the message starts with; `launcher` reads the same and cannot be set."""
    assert str(error).startswith(f"{error.source}: ")
    assert error.launcher == error.source
    with pytest.raises(AttributeError):
        error.launcher = "other"  # type: ignore[misc]


def test_a_launchers_error_names_it_as_source() -> None:
    """An error found in a launcher's variables has that launcher as its source."""
    with pytest.raises(DistEnvError) as info:
        detect("slurm", {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "x"})
    assert info.value.source == "slurm"
    assert info.value.variable == "SLURM_PROCID"


def test_a_long_value_is_quoted_short_and_kept_whole() -> None:
    """A megabyte-long value makes a one-line message of a few hundred characters; the error's
    `value` keeps it whole, for programs."""
    value = "[" * 1_000_000
    exc = InvalidVariableError("sagemaker", "SM_HOSTS", value, "a JSON list")
    assert len(str(exc)) < 300
    assert "(1000000 characters)" in str(exc)
    assert exc.value == value
    short = InvalidVariableError("slurm", "SLURM_PROCID", "x", "an integer")
    assert str(short) == "slurm: $SLURM_PROCID is 'x', expected an integer"


def _drawn(cls: type, prefix: str = "") -> list[str]:
    """Draw the subclasses of `cls` in `distenv.errors` as the module docstring does (names only)."""
    # Only the module's own classes (exits.py makes same-named hybrids for the one-line exit).
    children = [c for c in cls.__subclasses__() if getattr(errors, c.__name__, None) is c]
    lines = []
    for index, child in enumerate(children):
        last = index == len(children) - 1
        lines.append(f"{prefix}{'└── ' if last else '├── '}{child.__name__}")
        lines += _drawn(child, prefix + ("    " if last else "│   "))
    return lines


def test_the_docstrings_tree_is_the_class_tree() -> None:
    """The tree drawn in `distenv.errors`' docstring is the class tree, every public error in it."""
    drawn = [
        match[1]
        for line in (errors.__doc__ or "").splitlines()
        if (match := re.match(r"^    ((?:[│├└─ ]*)?\w*Error)\b", line))
    ]
    assert drawn == ["DistEnvError", *_drawn(DistEnvError)], "\n".join(_drawn(DistEnvError))
    assert {line.strip("├└─│ ") for line in drawn} == set(errors.__all__)
