"""The `distenv` command: info, export, exit statuses."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from distenv.cli import main
from tests.conftest import scrubbed_environ
from tests.envs import mpi, slurm, torchrun


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distenv", *args],
        env={**scrubbed_environ(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_info_json_is_one_object_with_stable_fields_and_types() -> None:
    """`python -m distenv info --json` prints exactly one JSON object; ints stay numbers."""
    result = run_cli("info", "--json", "--launcher", "slurm", env=slurm.SRUN_2N_4T[2])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data == {
        "launcher": "slurm",
        "rank": 2,
        "world_size": 4,
        "local_rank": 0,
        "local_world_size": 2,
        "node_rank": 1,
        "num_nodes": 2,
        "master_addr": "n1",
        "master_port": data["master_port"],
        "job_id": slurm.SRUN_2N_4T[2]["SLURM_JOB_ID"],
    }
    assert isinstance(data["master_port"], int)


def test_info_no_resolve_prints_null_master_for_mpi() -> None:
    """Under mpirun without MASTER_ADDR, --no-resolve leaves the master null (no MPI call)."""
    result = run_cli("info", "--json", "--no-resolve", env=mpi.OMPI_4[1])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["launcher"], data["rank"], data["master_addr"], data["master_port"]) == (
        "mpi",
        1,
        None,
        None,
    )


def test_info_single_process_resolves_a_free_port() -> None:
    """On a laptop, info says rank 0 of 1 on 127.0.0.1 with a real port."""
    data = json.loads(run_cli("info", "--json").stdout)
    assert (data["launcher"], data["world_size"], data["master_addr"]) == ("none", 1, "127.0.0.1")
    assert 1 <= data["master_port"] <= 65535


def test_info_table_explains_the_choice() -> None:
    """The human table lists the fields and why auto chose what it chose."""
    result = run_cli("info", env=torchrun.TORCHRUN_IN_SRUN_2N[3])
    assert result.returncode == 0, result.stderr
    assert "launcher          pytorch" in result.stdout
    assert "chosen: innermost launcher detected" in result.stdout
    assert "slurm    detected" in result.stdout


def test_export_lines_are_shell_quoted_and_tagged() -> None:
    """`distenv export` prints eval-able lines, including the DISTENV_SCOPE tag."""
    result = run_cli("export", env=torchrun.TORCHRUN_4[3])
    assert result.returncode == 0, result.stderr
    exported = {}
    for line in result.stdout.splitlines():
        words = shlex.split(line)
        assert words[0] == "export"
        name, _, value = words[1].partition("=")
        exported[name] = value
    assert exported["RANK"] == "3"
    assert exported["MASTER_ADDR"] == "localhost"
    assert exported["DISTENV_SCOPE"].startswith("pytorch/")


def test_distenv_error_is_one_line_exit_1() -> None:
    """A DistEnvError prints one line on stderr, no traceback, and exits 1."""
    result = run_cli("info", env=slurm.SBATCH_BATCH_4T[0])
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("distenv: slurm: ")
    assert "Traceback" not in result.stderr


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown launcher names and subcommands are usage errors (exit 2)."""
    with pytest.raises(SystemExit) as caught:
        main(["info", "--launcher", "pbs"])
    assert caught.value.code == 2
    assert "unknown launcher 'pbs'" in capsys.readouterr().err


def test_torchrun_alias_is_accepted() -> None:
    """`--launcher torchrun` is the same as `--launcher pytorch`."""
    result = run_cli("info", "--json", "--launcher", "torchrun", env=torchrun.TORCHRUN_4[0])
    assert json.loads(result.stdout)["launcher"] == "pytorch"


def test_master_addr_format_option() -> None:
    """`--master-addr-format '{host}-ib'` maps the step's first host, like the env setting."""
    result = run_cli("info", "--json", "--master-addr-format", "{host}-ib", env=slurm.SRUN_2N_4T[1])
    assert json.loads(result.stdout)["master_addr"] == "n1-ib"
