"""The kinds of a problem's fields, declared once per problem class, and the one parser that reads them.

A problem read from the store is untrusted (docs/security.md): each class in
`distenv.bootstrap.problems` declares, with `declare`, every field it has and its kind (a rank, a
count bounded by the world or by another field, host names, a text from a fixed set, ...), and
`build` checks a record against that declaration, field by field in the declared order, raising
`ForeignRecordError` naming the key for anything else. The declaration is checked against the
class's own fields when the class is made, so a field cannot go undeclared. Pure, like
`distenv.bootstrap.records`: no torch, no store, no process state.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from distenv.bootstrap.records import MAX_RANK, MAX_SHOWN, Fields, ForeignRecordError, matches

__all__ = [
    "HOST",
    "HOSTS",
    "NODE",
    "OWN_WORLD_SIZE",
    "RANK",
    "RANKS",
    "AgreedValues",
    "Bound",
    "Integer",
    "Items",
    "Kind",
    "OneOf",
    "Text",
    "Totals",
    "after",
    "build",
    "declare",
    "hosts_text",
    "length",
    "listed",
    "number",
    "optional",
    "pattern",
    "ranks_text",
    "world",
]

#: The fields read so far, by name: a later field's bounds may depend on them.
Got = Mapping[str, Any]
#: A bound: a constant, or computed from the reader's world size and the fields read so far.
Bound = int | Callable[[int, Got], int]
#: A check of one element of a list field.
Element = Callable[[object, int, Got], bool]


def _at(bound: Bound, world_size: int, got: Got) -> int:
    return bound if isinstance(bound, int) else bound(world_size, got)


def world(plus: int = 0) -> Bound:
    """Return the bound ``world_size + plus`` (the reader's own world size, never the record's)."""
    return lambda world_size, got: world_size + plus


def length(of: str, least: int = 0) -> Bound:
    """Return the bound "the length of field `of` read before, or `least` if more"."""
    return lambda world_size, got: max(len(got[of]), least)


def after(of: str) -> Bound:
    """Return the bound "one more than integer field `of` read before"."""
    return lambda world_size, got: int(got[of]) + 1


# ---- elements of list fields ---------------------------------------------------------------------------


def number(low: Bound, high: Bound) -> Element:
    """Return a check for an integer in ``[low, high)`` (never a bool)."""
    return lambda v, w, got: type(v) is int and _at(low, w, got) <= v < _at(high, w, got)


def pattern(name: str) -> Element:
    """Return a check for a string matching the pattern `name` of `distenv.bootstrap.records`."""
    return lambda v, w, got: matches(name, v)


def optional(element: Element) -> Element:
    """Return a check for None or what `element` accepts."""
    return lambda v, w, got: v is None or element(v, w, got)


def listed(element: Element, cap: int = MAX_SHOWN) -> Element:
    """Return a check for a list of at most `cap` elements, each of which `element` accepts."""
    return lambda v, w, got: (
        isinstance(v, list) and len(v) <= cap and all(element(e, w, got) for e in v)
    )


# ---- field kinds -----------------------------------------------------------------------------------------


class Kind:
    """How one field is read: its shape first (`shape`), then its value (`check`).

    The parser checks the lengths a class says must match between the two, so that a later
    check may pair a field's elements with another's.
    """

    def shape(self, fields: Fields, name: str) -> Any:
        """Return the field's raw value, its container checked (a list's type and cap)."""
        return fields.data[name]

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        """Return the field's value, checked (`ForeignRecordError` if it is not of this kind)."""
        raise NotImplementedError


class Integer(Kind):
    """An integer in ``[low, high)``; with `optional`, None too."""

    def __init__(self, low: Bound, high: Bound, *, optional: bool = False) -> None:
        self.low, self.high, self.optional = low, high, optional

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        if self.optional and raw is None:
            return None
        return fields.integer(name, _at(self.low, world_size, got), _at(self.high, world_size, got))


class Text(Kind):
    """A string matching its pattern (the field's own name unless `pattern` names another)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = pattern

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        return fields.text(name, self.pattern)


class OneOf(Kind):
    """One of a fixed set of values (`why` says which set when it is not)."""

    def __init__(self, choices: Iterable[object], why: str) -> None:
        self.choices, self.why = tuple(choices), why

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        if raw not in self.choices:
            raise ForeignRecordError(fields.key, self.why)
        return raw


class Items(Kind):
    """A list of `least` to `cap` elements, each of which `element` accepts, read as a tuple
    (its list elements as tuples too). `why` may name the field as ``{name!r}``."""

    def __init__(self, element: Element, why: str, *, cap: int = MAX_SHOWN, least: int = 0) -> None:
        self.element, self.why, self.cap, self.least = element, why, cap, least

    def shape(self, fields: Fields, name: str) -> Any:
        return fields.items(name, self.cap)

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        if len(raw) < self.least or not all(self.element(v, world_size, got) for v in raw):
            raise ForeignRecordError(fields.key, self.why.format(name=name))
        return tuple(tuple(v) if isinstance(v, list) else v for v in raw)


class AgreedValues(Items):
    """The values ranks gave for the agreed field named by field `of`: world sizes, or strings of
    that field's pattern."""

    def __init__(self, of: str) -> None:
        super().__init__(lambda v, w, got: True, "")
        self.of = of

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        field = got[self.of]
        if field == "world_size":
            if not all(type(v) is int and 0 < v <= MAX_RANK for v in raw):
                raise ForeignRecordError(fields.key, "values are not world sizes")
        elif not all(matches(field, v) for v in raw):
            raise ForeignRecordError(fields.key, f"values do not match the pattern of {field}")
        return tuple(raw)


class Totals(Items):
    """Counts, each at least as large as the list at its index in field `of`."""

    def __init__(self, of: str) -> None:
        super().__init__(lambda v, w, got: True, "totals are not counts")
        self.of = of

    def check(self, fields: Fields, name: str, raw: Any, world_size: int, got: Got) -> Any:
        for shown, total in zip(got[self.of], raw, strict=True):
            if type(total) is not int or not len(shown) <= total <= MAX_RANK:
                raise ForeignRecordError(fields.key, self.why)
        return tuple(raw)


# ---- the declarations and the parser ---------------------------------------------------------------------

_P = TypeVar("_P", bound=type)


class _Declaration:
    def __init__(self, kinds: Mapping[str, Kind], same: Sequence[str], why: str) -> None:
        self.kinds, self.same, self.why = dict(kinds), tuple(same), why
        # The lengths are compared once the last of them is shaped, before its elements' checks.
        self.last = max(same, key=list(kinds).index) if same else None


_DECLARED: dict[type, _Declaration] = {}


def declare(
    kinds: Mapping[str, Kind], *, same: Sequence[str] = (), why: str | None = None
) -> Callable[[_P], _P]:
    """Declare a problem class's fields: each with its kind, checked in this order by `build`.

    `same` names list fields whose lengths must match (`why`, if given, says so instead of
    "a, b and c differ in length"). Raises TypeError at import when the declaration and the
    class's fields differ.
    """
    if why is None and same:
        why = f"{', '.join(same[:-1])} and {same[-1]} differ in length"

    def register(cls: _P) -> _P:
        names = getattr(cls, "_fields", ())
        if set(kinds) != set(names) or not set(same) <= set(kinds):
            raise TypeError(f"{cls.__name__}: declared {sorted(kinds)}, has {sorted(names)}")
        _DECLARED[cls] = _Declaration(kinds, same, why or "")
        return cls

    return register


def build(cls: type, fields: Fields, world_size: int) -> Any:
    """Return an instance of `cls` read from `fields` by its declaration (`ForeignRecordError` if
    the record is not one)."""
    declared = _DECLARED[cls]
    got: dict[str, Any] = {}
    for name, kind in declared.kinds.items():
        raw = kind.shape(fields, name)
        if name == declared.last:
            lengths = {len(raw) if n == name else len(got[n]) for n in declared.same}
            if len(lengths) > 1:
                raise ForeignRecordError(fields.key, declared.why)
        got[name] = kind.check(fields, name, raw, world_size, got)
    return cls(**got)


# ---- the kinds most problems share, and how their values are shown ------------------------------------

RANK = Integer(0, world())
RANKS = Items(number(0, world()), "field {name!r} is not a list of ranks")
#: A node index, or None where the launcher named no node (the roll call numbers hosts).
NODE = Integer(0, world(), optional=True)
HOST = Text("hostname")
HOSTS = Items(pattern("hostname"), "field {name!r} is not a list of host names")
#: The reader's own world size: a problem names the world of the rank that reads it, or none.
OWN_WORLD_SIZE = Integer(world(), world(1))


def hosts_text(hosts: Iterable[str]) -> str:
    """Return host names as quoted data: they come from the store, whoever wrote them there."""
    return ", ".join(map(repr, hosts))


def ranks_text(shown: Sequence[int], total: int) -> str:
    """Return the first 8 of the ranks `shown`, and how many there are in all if more."""
    text = ", ".join(str(r) for r in shown[:8])
    return text + (f", ... ({total} in all)" if total > 8 else "")
