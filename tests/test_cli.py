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
    """Run ``python -m distenv ARGS`` (``python ARGS`` when they start with an option)."""
    argv = [*args] if args[0].startswith("-") else ["-m", "distenv", *args]
    return subprocess.run(
        [sys.executable, *argv],
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
        "restart_count": 0,
    }
    assert isinstance(data["master_port"], int)


def test_info_shows_the_restart_count_after_a_requeue() -> None:
    """A requeued Slurm job (SLURM_RESTART_COUNT=1) says so in both `info` forms."""
    env = {**slurm.SRUN_2N_4T[2], "SLURM_RESTART_COUNT": "1"}
    data = json.loads(run_cli("info", "--json", env=env).stdout)
    assert data["restart_count"] == 1
    table = run_cli("info", env=env)
    assert table.returncode == 0, table.stderr
    assert any(line.split() == ["restart_count", "1"] for line in table.stdout.splitlines())


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


def test_info_under_mpi_leaves_the_master_to_init_and_loads_no_mpi4py() -> None:
    """No MASTER_ADDR under mpirun: null master, no mpi4py import, fields unchanged (no --mpi)."""
    result = run_cli("-X", "importtime", "-m", "distenv", "info", "--json", env=mpi.OMPI_4[1])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == list(json.loads(run_cli("info", "--json").stdout))
    assert (data["launcher"], data["rank"], data["master_addr"], data["master_port"]) == (
        "mpi",
        1,
        None,
        None,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "distenv.cli" in imported
    assert not [name for name in imported if name.startswith("mpi4py")]


def test_info_text_says_the_master_comes_over_mpi_at_init() -> None:
    """The table says where an MPI job's master will come from, and how to ask now."""
    result = run_cli("info", env=mpi.HYDRA_4[2])
    assert result.returncode == 0, result.stderr
    assert "master_addr       rank 0's host over MPI at init (pass --mpi to ask now)" in (
        result.stdout
    )
    assert "master_port       rank 0's free port over MPI at init (pass --mpi to ask now)" in (
        result.stdout
    )


def test_info_mpi_and_no_resolve_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    """`--mpi` asks MPI, `--no-resolve` asks nothing: together they are a usage error."""
    with pytest.raises(SystemExit) as caught:
        main(["info", "--mpi", "--no-resolve"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_export_under_mpi_without_a_master_asks_for_mpi() -> None:
    """`distenv export` under mpirun with no MASTER_ADDR: one line saying to pass --mpi, exit 1."""
    result = run_cli("export", env=mpi.OMPI_4[3])
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        "distenv: mpi: rank 3 of 4 has no MASTER_ADDR: rank 0 sends its master over MPI at "
        "init. Hint: pass --mpi to ask now (on every rank: it is collective), or export "
        "MASTER_ADDR and MASTER_PORT\n"
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
