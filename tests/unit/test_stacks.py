"""Which frames are the user's: never distenv's own (any subpackage), Python's or a package's."""

from __future__ import annotations

import json
import os

import pytest

import distenv
from distenv import exits
from distenv.bootstrap import init
from distenv.postmortem import stacks


@pytest.mark.parametrize(
    "module", [distenv, exits, init, stacks, json, os], ids=lambda m: m.__name__
)
def test_distenv_and_pythons_own_files_are_not_the_users(module: object) -> None:
    """A frame in distenv (top level or a subpackage), the standard library or the venv's
    packages is never shown as where the user's code failed."""
    assert not stacks.users_file(str(getattr(module, "__file__", "")))


def test_a_script_outside_the_installation_is_the_users(tmp_path: object) -> None:
    """A training script in its own folder is the user's; a frozen or generated frame is not."""
    assert stacks.users_file(os.path.join(str(tmp_path), "train.py"))
    assert not stacks.users_file("<string>")
