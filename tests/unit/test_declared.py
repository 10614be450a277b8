"""Each backend reads only the variables it declares (the docs render that declaration)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest

from distenv import DistEnvError
from distenv.launchers import Launcher, Scheduler
from distenv.launchers.registry import BUILTIN
from tests.support.envs import (
    awsbatch,
    azureml,
    flux,
    indexed_job,
    kubeflow,
    lsf,
    mpi,
    pbs,
    sagemaker,
    skypilot,
    slurm,
    torchrun,
    vertex,
    volcano,
)


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


def _all_envs() -> list[dict[str, str]]:
    envs: list[dict[str, str]] = []
    for module in (
        slurm,
        mpi,
        torchrun,
        lsf,
        pbs,
        flux,
        kubeflow,
        indexed_job,
        volcano,
        sagemaker,
        azureml,
        skypilot,
        awsbatch,
        vertex,
    ):
        for name in dir(module):
            value = getattr(module, name)
            if not name.isupper():
                continue
            if isinstance(value, dict):
                envs.append(value)
            elif isinstance(value, list):
                envs.extend(v for v in value if isinstance(v, dict))
    return envs


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_backend_reads_only_declared_variables(launcher: Launcher) -> None:
    """Every method of every backend, over every captured environment, stays in its declaration."""
    declared = {v.name for v in launcher.variables}
    for data in _all_envs():
        env = RecordingEnv(data)
        calls = [
            launcher.detect,
            launcher.rank_info,
            launcher.world,
            launcher.scope,
            launcher.default_master,
            launcher.node_agent,
        ]
        if isinstance(launcher, Scheduler):
            calls += [launcher.allocation_master, launcher.daemon_nodes]
        for call in calls:
            with contextlib.suppress(DistEnvError):
                call(env)
        assert env.read <= declared, sorted(env.read - declared)


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_declaration_is_documented(launcher: Launcher) -> None:
    """Every declared variable has a field, a required-ness and a meaning, and appears once."""
    names = [v.name for v in launcher.variables]
    assert len(names) == len(set(names))
    for var in launcher.variables:
        assert var.field
        assert var.required
        assert var.meaning
