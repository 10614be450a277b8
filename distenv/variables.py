"""Typed, declared reads of environment variables: part of the public plug-in contract.

Each launcher declares the variables it reads as `Var` records, and so do distenv's own runtime
settings (`distenv.settings`). `Reader` is the only way a launcher looks at its mapping, and it
refuses names that were not declared, so the declaration (which the docs render) cannot drift from
what the parser does. Plug-ins import both from `distenv.launchers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distenv.errors import InvalidVariableError, MissingVariableError

__all__ = ["Reader", "Var", "decimal"]

# An integer an environment variable may reasonably hold for a rank or a count. Anything larger is a
# corrupted value, not a job (Frontier has ~75k GPUs).
MAX_COUNT = 10_000_000


def decimal(text: str, maximum: int = MAX_COUNT) -> int | None:
    """Return `text` as a decimal integer in ``[0, maximum]``, or None if it is not one.

    Only ASCII digits count (``int()`` also takes ``+5``, ``1_000`` and other scripts' digits, which
    no launcher writes), and no more of them are converted than `maximum` has: ``int()`` of over
    4300 digits raises ValueError (Python 3.11's limit), and of millions takes seconds.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(maximum)):
        return None
    number = int(digits)
    return number if number <= maximum else None


@dataclass(frozen=True)
class Var:
    """One environment variable a launcher reads.

    Attributes:
        name: The variable's name.
        field: What it fills: a `RankInfo` field name, or a short phrase (``detection``, ...).
        required: ``"yes"``, ``"no"``, or the condition under which it is needed.
        meaning: One line on what the variable is, citing its source where useful.
    """

    name: str
    field: str
    required: str
    meaning: str


class Reader:
    """Read the declared variables of one launcher (or component) from an environment mapping.

    Errors name `source` (the launcher's name). Empty values count as unset, everywhere.
    """

    def __init__(self, source: str, env: Mapping[str, str], variables: Sequence[Var]) -> None:
        self.source = source
        self.env = env
        self._declared = frozenset(v.name for v in variables)

    def _check_declared(self, name: str) -> None:
        if name not in self._declared:
            # A programming error in distenv itself, not a user error.
            raise AssertionError(f"{self.source} reads undeclared variable {name}")

    def get(self, name: str) -> str | None:
        """Return the variable's value, or None when it is unset or empty."""
        self._check_declared(name)
        value = self.env.get(name)
        return value if value else None

    def has(self, name: str) -> bool:
        """Return whether the variable is set to a non-empty value."""
        return self.get(name) is not None

    def first(self, *names: str) -> tuple[str, str] | None:
        """Return ``(name, value)`` of the first variable of `names` that is set."""
        for name in names:
            value = self.get(name)
            if value is not None:
                return name, value
        return None

    def require(self, *names: str, hint: str | None = None) -> tuple[str, str]:
        """Return ``(name, value)`` of the first of `names` that is set, or raise naming the first."""
        found = self.first(*names)
        if found is None:
            raise MissingVariableError(self.source, names[0], hint=hint)
        return found

    def integer(
        self, *names: str, hint: str | None = None, minimum: int = 0, maximum: int = MAX_COUNT
    ) -> int:
        """Return the first set variable of `names` as an integer >= `minimum`.

        Raises:
            MissingVariableError: If none of them is set.
            InvalidVariableError: If the value is not an integer in range.
        """
        name, value = self.require(*names, hint=hint)
        return self.parse_int(name, value, hint=hint, minimum=minimum, maximum=maximum)

    def optional_int(
        self, *names: str, hint: str | None = None, minimum: int = 0, maximum: int = MAX_COUNT
    ) -> int | None:
        """Like `integer`, but return None when none of `names` is set."""
        found = self.first(*names)
        if found is None:
            return None
        return self.parse_int(*found, hint=hint, minimum=minimum, maximum=maximum)

    def parse_int(
        self,
        name: str,
        value: str,
        *,
        hint: str | None = None,
        minimum: int = 0,
        maximum: int = MAX_COUNT,
    ) -> int:
        """Parse `value` (read from `name`) as a decimal integer in ``[minimum, maximum]``."""
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            expected = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
            raise InvalidVariableError(self.source, name, value, expected, hint=hint)
        number = decimal(text, maximum)
        if number is None or number < minimum:
            raise InvalidVariableError(
                self.source, name, value, f"an integer in [{minimum}, {maximum}]", hint=hint
            )
        return number
