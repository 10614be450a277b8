"""Each backend reads only the variables it declares (the docs render that declaration)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping

import pytest

import tests.support.envs
from distenv import DistEnvError, RankInfo
from distenv.launchers import AllocationLauncher, Launcher, Scheduler
from distenv.launchers.registry import BUILTIN
from tests.support.envs import recorded

RECORDED = recorded()


class RecordingEnv(Mapping[str, str]):
    """A read-only mapping that remembers every key looked up."""

    def __init__(self, data: Mapping[str, str]) -> None:
        self.data = dict(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("a backend must not scan the whole environment")

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_backend_reads_only_declared_variables(launcher: Launcher) -> None:
    """Every method of every backend, over every recorded environment of every launcher
    (tests/support/envs, found by `recorded`), stays in its declaration."""
    declared = {v.name for v in launcher.variables}
    for where, data in RECORDED.items():
        env = RecordingEnv(data)
        calls: list[Callable[[Mapping[str, str]], object]] = [
            launcher.detect,
            launcher.rank_info,
            launcher.world,
            launcher.scope,
            launcher.restart_count,
            launcher.default_master,
            launcher.node_agent,
            launcher.processes_per_node,
        ]
        if isinstance(launcher, Scheduler):
            calls += [launcher.allocation_master, launcher.daemon_nodes, launcher.requeue_command]
        if isinstance(launcher, AllocationLauncher):
            calls.append(functools.partial(launcher.placed_rank_info, nodes=None))
        for call in calls:
            with contextlib.suppress(DistEnvError):
                call(env)
        assert env.read <= declared, (where, sorted(env.read - declared))


def test_every_recorded_module_reaches_the_checks() -> None:
    """`recorded` finds the environments of every module of tests/support/envs, Grid Engine's,
    HTCondor's, SkyPilot's and AWS Batch's among them (lists kept by hand had missed them)."""
    modules = {info.name for info in pkgutil.iter_modules(tests.support.envs.__path__)} - {
        "make_fixtures"
    }
    assert {where.split(".", 1)[0] for where in RECORDED} == modules
    assert {"gridengine.SGE_PE_SCRIPT[0]", "htcondor.NODE1_OF_2[0]"} <= set(RECORDED)
    assert {"skypilot.SKY_2N_NODE1[0]", "awsbatch.MNP_2N_CHILD[0]", "slurm.SRUN_2N_4T[3]"} <= set(
        RECORDED
    )


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_declaration_is_documented(launcher: Launcher) -> None:
    """Every declared variable has a field, a required-ness and a meaning, and appears once."""
    names = [v.name for v in launcher.variables]
    assert len(names) == len(set(names))
    for var in launcher.variables:
        assert var.field
        assert var.required
        assert var.meaning


# A variable's name in a docstring table: upper case, digits and underscores.
NAME = re.compile(r"\b_?[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*\b")
FIELDS = {field.name for field in dataclasses.fields(RankInfo)}


def _tables(doc: str) -> Iterator[list[list[str]]]:
    """Yield each Markdown table of `doc` as rows of cells, its header row first."""
    table: list[list[str]] = []
    for line in [*doc.splitlines(), ""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            yield table
            table = []


def _documented(doc: str) -> Iterator[tuple[str, str, str]]:
    """Yield ``(variable, column, required)`` for every variable a docstring's tables name.

    A ``variable | fills | required`` table names its variables in its first column, alternate
    spellings in parentheses (``SLURM_JOB_ID (SLURM_JOBID)``): `required` is the row's for the
    names before the parentheses, "" for the alternates. A table whose columns are `RankInfo`
    fields (mpi's, one row per MPI library) names in each cell the variables that fill it:
    `column` is that field, `required` "".
    """
    for header, *rows in _tables(doc):
        for row in rows:
            if header[0] == "variable":
                primary, _, alternates = row[0].partition("(")
                yield from ((name, "", row[2]) for name in NAME.findall(primary))
                yield from ((name, "", "") for name in NAME.findall(alternates))
            else:
                for column, cell in zip(header[1:], row[1:], strict=True):
                    assert column in FIELDS, column
                    yield from ((name, column, "") for name in NAME.findall(cell))


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_docstring_table_is_the_declaration(launcher: Launcher) -> None:
    """The class docstring's tables name every declared variable, in declaration order, and no
    other; each row's required-ness is its variables' declaration's, and a column named for a
    RankInfo field holds only variables declared to fill it. The docs render `variables`
    (`<!-- env-table: NAME -->`); this keeps the table a reader of the source sees the same."""
    declared = {var.name: var for var in launcher.variables}
    documented = list(_documented(inspect.getdoc(type(launcher)) or ""))
    names = list(dict.fromkeys(name for name, _, _ in documented))
    assert names == list(declared), "the docstring's tables name these, the declaration those"
    for name, column, required in documented:
        if required:
            assert declared[name].required == required, name
        if column:
            assert declared[name].field == column, name
