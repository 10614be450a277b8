"""The registry of built-in launchers: one ordered tuple, and everything else derived from it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import distenv.launchers
from distenv.launchers import Launcher, Scheduler
from distenv.launchers.registry import BUILTIN, BUILTINS, CHOICES, DETECTION_ORDER, NONE


def test_every_launcher_class_of_the_package_is_registered_once() -> None:
    """A launcher module added without its instance in `BUILTINS` (or registered twice) fails."""
    classes: set[type[Launcher]] = set()
    for info in pkgutil.iter_modules(distenv.launchers.__path__):
        module = importlib.import_module(f"distenv.launchers.{info.name}")
        classes |= {
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Launcher)
            and cls.__module__ == module.__name__
            and not inspect.isabstract(cls)
        }
    registered = [type(launcher) for launcher in BUILTINS]
    assert sorted(registered, key=str) == sorted(classes, key=str)
    assert len(set(registered)) == len(registered)


def test_names_order_and_choices_come_from_the_tuple() -> None:
    """`BUILTIN`, `DETECTION_ORDER` and the choices follow `BUILTINS`; `none` is never detected,
    and the built-in launchers that spawn processes come before every scheduler."""
    assert list(BUILTIN.values()) == list(BUILTINS)
    assert tuple(launcher.name for launcher in BUILTINS[:-1]) == DETECTION_ORDER
    assert BUILTINS[-1] is NONE
    assert CHOICES[: len(BUILTINS) + 1] == ("auto", *BUILTIN)
    kinds = [isinstance(BUILTIN[name], Scheduler) for name in DETECTION_ORDER]
    assert kinds == sorted(kinds)
