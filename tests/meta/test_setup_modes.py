"""tests/harness/setup.sh's two modes: `--venv-only` (examples/run.sh, the main job) installs the
job's set only, and the full set-up (tests/run.sh) does not take that venv for its own.

A copy of setup.sh runs in a temporary repository where every Python it starts is a stub that
records its arguments (`-m venv` copies the stub, `-m pip` installs nothing) and `dpkg-query`
reports every package installed: nothing is installed, no daemon is started (apt-get and the
daemons' starters are stubs that fail, should the script ever get that far).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "harness"

# The full set-up must stop before what needs the machine (MPICH, munge, Slurm): with
# $STUB_FAIL_PIP set a pip run of the main venv fails (exit 7), at its first install; with
# $STUB_YAPF set yapf is "installed" but fails to import, right after the venv's stamp is written.
STUB_PYTHON = r"""#!/usr/bin/env bash
printf '%s %s\n' "$0" "$*" >>"$STUB_LOG"
case "$1" in
    --version) echo "Python 3 (stub)" ;;
    -m)
        if [[ $2 == venv ]]; then
            mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
        elif [[ $2 == pip && -n ${STUB_FAIL_PIP:-} && $0 == "$STUB_MAIN_PYTHON" ]]; then
            exit 7
        fi
        ;;
    -c)
        if [[ $2 == *sysconfig* ]]; then echo "$(dirname "$0")/../lib/site-packages"; fi
        if [[ $2 == *find_spec*yapf* ]]; then [[ -n ${STUB_YAPF:-} ]]; exit; fi
        if [[ $2 == "import yapf" ]]; then exit 9; fi
        ;;
esac
exit 0
"""


@dataclass(frozen=True)
class Sandbox:
    """A temporary repository holding a copy of setup.sh, and stubs on PATH."""

    repo: Path
    env: dict[str, str]
    log: Path

    def setup(self, *args: str) -> tuple[int, str, list[str]]:
        """Run the copy of setup.sh; return its status, its output and the pip runs of .venv."""
        self.log.write_text("")
        done = subprocess.run(
            ["bash", str(self.repo / "tests" / "harness" / "setup.sh"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        main = str(self.repo / ".venv" / "bin" / "python")
        pips = [
            line.removeprefix(f"{main} -m pip install ")
            for line in self.log.read_text().splitlines()
            if line.startswith(f"{main} -m pip ")
        ]
        return done.returncode, done.stdout + done.stderr, pips


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    """Copy setup.sh and the files its stamp hashes; put the stubs first on PATH."""
    repo = tmp_path / "repo"
    (repo / "tests" / "harness").mkdir(parents=True)
    for name in ("setup.sh", "constraints.txt"):
        shutil.copy(HARNESS / name, repo / "tests" / "harness" / name)
    for name in ("setup.cfg", "pyproject.toml"):
        shutil.copy(REPO / name, repo / name)
    (repo / "distenv").mkdir()
    (repo / "distenv" / "__init__.py").write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    python = bin_ / "python3"
    python.write_text(STUB_PYTHON)
    dpkg_query = bin_ / "dpkg-query"
    dpkg_query.write_text("#!/bin/sh\nprintf 'install ok installed'\n")
    stubs = [python, dpkg_query]
    for name in ("apt-get", "runuser", "munged", "setsid", "slurmctld", "slurmd", "unshare"):
        stubs.append(bin_ / name)
        stubs[-1].write_text(f"#!/bin/sh\necho '{name}: stubbed by {__name__}' >&2\nexit 99\n")
    for stub in stubs:
        stub.chmod(0o755)
    log = tmp_path / "stub.log"
    env = {
        **scrubbed_environ(),
        "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(python),
        "DISTENV_TEST_STATE": str(tmp_path / "state"),
        "STUB_LOG": str(log),
        "STUB_MAIN_PYTHON": str(repo / ".venv" / "bin" / "python"),
    }
    return Sandbox(repo, env, log)


def test_venv_only_installs_the_main_jobs_set_once(sandbox: Sandbox) -> None:
    """--venv-only installs torch and distenv (no test, lint or docs tools, no frameworks),
    saying so step by step, and a second run finds the venv up to date."""
    status, out, pips = sandbox.setup("--venv-only")
    assert status == 0, out
    assert "venv: pip install torch==2.13.0 (the main job's set only" in out
    assert "apt:" not in out, out
    assert len(pips) == 2, pips
    assert pips[0].endswith("torch==2.13.0 setuptools>=77.0.3"), pips
    assert pips[1].endswith(f"-e {sandbox.repo}"), pips
    args = " ".join(pips).split()
    assert "pytest" not in args, pips
    assert not [a for a in args if a.endswith("]")], pips  # no extras
    # Bytecode for what every rank imports, written once (PYTHONDONTWRITEBYTECODE images).
    main = f"{sandbox.repo / '.venv' / 'bin' / 'python'} "
    runs = [run.removeprefix(main) for run in sandbox.log.read_text().splitlines()]
    assert any(
        run.startswith("-m compileall -q -j 0 -x /torch/testing/ ") and run.endswith("/torch")
        for run in runs
    ), runs
    assert "-c import torch, torch.distributed, torch.nn.parallel, torch._dynamo" in runs, runs
    # And the checkout's own (an editable install has none), at every run: a source changes.
    checkout = " ".join(str(sandbox.repo / d) for d in ("distenv", "examples", "tests"))
    assert f"-m compileall -q -j 0 {checkout}" in runs, runs

    status, out, pips = sandbox.setup("--venv-only")
    assert status == 0, out
    assert "venv: up to date" in out, out
    assert pips == []
    assert f"{main}-m compileall -q -j 0 {checkout}" in sandbox.log.read_text().splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="the full set-up runs as root only")
def test_full_set_up_reinstalls_after_venv_only(sandbox: Sandbox) -> None:
    """tests/run.sh after examples/run.sh: the main job's stamp does not satisfy the full set-up,
    which runs its own pip installs from torch on; the full set-up's stamp, another key, then
    satisfies the main job."""
    status, out, _ = sandbox.setup("--venv-only")
    assert status == 0, out
    stamp = sandbox.repo / ".venv" / ".distenv-setup-stamp"
    job_key = stamp.read_text()

    sandbox.env["STUB_FAIL_PIP"] = "1"
    status, out, pips = sandbox.setup()
    assert status == 7, out  # the stub's pip failed: the full set-up went on to install
    assert "venv: up to date" not in out, out
    assert "venv: pip install torch==2.13.0\n" in out, out
    assert pips == ["-q --disable-pip-version-check torch==2.13.0"]

    del sandbox.env["STUB_FAIL_PIP"]
    sandbox.env["STUB_YAPF"] = "1"
    status, out, pips = sandbox.setup()
    assert status == 1, out
    assert "importing yapf (to write its grammar cache) failed" in out, out
    assert pips[-1].endswith(f"-e {sandbox.repo}[mpi,test,lint,docs,frameworks]"), pips
    assert stamp.read_text() != job_key

    del sandbox.env["STUB_YAPF"]
    status, out, pips = sandbox.setup("--venv-only")
    assert status == 0, out
    assert "venv: up to date" in out, out
    assert pips == []
