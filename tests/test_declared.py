"""Each backend reads only the variables it declares (the docs render that declaration)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest

from distenv import DistEnvError
from distenv.launchers import BUILTIN, Launcher
from tests.envs import azureml, indexed_job, kubeflow, lsf, mpi, sagemaker, slurm, torchrun, volcano


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
    for module in (slurm, mpi, torchrun):
        for name in dir(module):
            if name.isupper():
                envs.extend(getattr(module, name))
    envs.extend(getattr(lsf, n) for n in dir(lsf) if n.isupper())
    envs.extend(getattr(kubeflow, n) for n in dir(kubeflow) if n.isupper())
    envs.extend(getattr(sagemaker, n) for n in dir(sagemaker) if n.isupper())
    envs.extend(getattr(azureml, n) for n in dir(azureml) if n.isupper())
    envs.extend(getattr(indexed_job, n) for n in dir(indexed_job) if n.isupper())
    envs.extend(getattr(volcano, n) for n in dir(volcano) if n.isupper())
    return envs


@pytest.mark.parametrize("launcher", list(BUILTIN.values()), ids=list(BUILTIN))
def test_backend_reads_only_declared_variables(launcher: Launcher) -> None:
    """Every method of every backend, over every captured environment, stays in its declaration."""
    declared = {v.name for v in launcher.variables}
    for data in _all_envs():
        env = RecordingEnv(data)
        for call in (
            launcher.detect,
            launcher.rank_info,
            launcher.world,
            launcher.scope,
            launcher.allocation_master,
            launcher.default_master,
            launcher.daemon_nodes,
            launcher.node_agent,
        ):
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
