"""Numbers from outside, of any size: parsed without ``int()`` of too many digits (#44 item 11).

Python 3.11 refuses ``int()`` of more than 4300 digits (ValueError), and ``repr()`` of such an int:
a variable, an option or an argument holding one ended in a traceback instead of its one line.
"""

from __future__ import annotations

import contextlib
import io
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distenv.cli import build_parser
from distenv.errors import ConfigurationError, quoted
from distenv.seeding import check_seed
from distenv.variables import MAX_COUNT, decimal

DIGITS = st.text("0123456789", min_size=1, max_size=6000) | st.integers(0, 10**30).map(str)


@settings(derandomize=True, max_examples=200, deadline=None, database=None)
@given(text=DIGITS)
@example(text="9" * 5000)
@example(text="0" * 5000 + "7")
@example(text=str(MAX_COUNT))
@example(text=str(MAX_COUNT + 1))
def test_decimal_is_int_within_its_maximum_and_none_past_it(text: str) -> None:
    """Any string of digits: the number when it is at most the maximum, else None; never raises."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # the reference conversion, any size
    try:
        number = int(text)
    finally:
        sys.set_int_max_str_digits(previous)
    assert decimal(text) == (number if number <= MAX_COUNT else None)


@pytest.mark.parametrize("text", ["", "-1", "+5", "1_000", "\u00b2", "\uff11", " 1", "1e3"])
def test_decimal_takes_plain_ascii_digits_only(text: str) -> None:
    assert decimal(text) is None


OPTIONS = ["-n", "--nnodes", "--node-rank", "--max-restarts", "--master-port", "--ranks"]


@pytest.mark.parametrize("option", OPTIONS)
@settings(derandomize=True, max_examples=20, deadline=None, database=None)
@given(text=DIGITS)
@example(text="9" * 5000)
def test_an_integer_option_of_any_size_is_parsed_or_refused_in_one_line(
    option: str, text: str
) -> None:
    """distenv run's integer options: any digits are a value or a usage error naming the option,
    with the value elided past 120 characters."""
    code = None
    with contextlib.redirect_stderr(io.StringIO()) as stderr:
        try:
            build_parser().parse_args(["run", option, text, "x.py"])
        except SystemExit as exc:
            code = exc.code
    err = stderr.getvalue()
    if code is None:  # a value within bounds
        assert err == ""
        return
    assert code == 2
    last = err.splitlines()[-1]
    assert last.startswith(f"distenv run: error: argument {option}"), last
    assert len(last) < 400, last


@pytest.mark.parametrize("seed", [10**5000, -(10**5000), 2**32], ids=["huge", "-huge", "2**32"])
def test_a_seed_of_any_size_is_refused_in_one_line(seed: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_seed(seed)
    assert str(info.value).startswith(f"seed: seed={quoted(seed)} is not an integer in [0, 2**32)")
    assert len(str(info.value)) < 300


def test_quoted_describes_a_huge_int_by_its_size() -> None:
    assert quoted(10**5000) == "<an integer of 16610 bits>"
    assert quoted(-(10**5000)) == "<a negative integer of 16610 bits>"
    assert quoted(7) == "7"
    assert quoted("x" * 500).endswith("(502 characters)")
