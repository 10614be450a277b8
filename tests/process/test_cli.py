"""The `distenv` command: info, export, exit statuses."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from distenv.cli import build_parser, main
from distenv.system.containers import container
from tests.conftest import scrubbed_environ
from tests.support.envs import flux, mpi, slurm, torchrun


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
    inside = container(slurm.SRUN_2N_4T[2])  # /.dockerenv on a CI machine that is a container
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
        "cuda_visible_devices": None,
        "container": None if inside is None else inside.runtime.name,
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
    assert re.search(
        r"^master_addr +rank 0's host over MPI at init \(pass --mpi to ask now\)$",
        result.stdout,
        re.M,
    ), result.stdout
    assert re.search(
        r"^master_port +rank 0's free port over MPI at init \(pass --mpi to ask now\)$",
        result.stdout,
        re.M,
    ), result.stdout


def test_info_says_the_node_layout_comes_from_the_roll_call() -> None:
    """MPI alone names no node layout across nodes: the table says so, the JSON gives typed
    nulls; where the local size is the world size, the one node is known at once."""
    two_nodes = {**mpi.HYDRA_4[2], "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}
    table = run_cli("info", env=two_nodes)
    assert table.returncode == 0, table.stderr
    for field in ("node_rank", "num_nodes"):
        assert re.search(rf"^{field} +from the roll call at init \(", table.stdout, re.M), (
            table.stdout
        )
    data = json.loads(run_cli("info", "--json", "--no-resolve", env=two_nodes).stdout)
    assert (data["local_world_size"], data["node_rank"], data["num_nodes"]) == (2, None, None)
    one_node = json.loads(run_cli("info", "--json", "--no-resolve", env=mpi.OMPI_4[3]).stdout)
    assert (one_node["local_world_size"], one_node["node_rank"], one_node["num_nodes"]) == (4, 0, 1)
    # Where a scheduler's daemon step spans the allocation, the layout is known before init.
    known = json.loads(run_cli("info", "--json", env=mpi.HYDRA_IN_SBATCH[3]).stdout)
    assert (known["node_rank"], known["num_nodes"]) == (1, 2)


def test_info_says_a_flux_tasks_local_size_comes_from_the_roll_call() -> None:
    """Flux with 2 tasks on each of 2 nodes: node index and local size are the roll call's."""
    env = {**flux.FLUX_2X2[3], "MASTER_ADDR": "fluke1"}
    table = run_cli("info", env=env)
    assert table.returncode == 0, table.stderr
    for field in ("node_rank", "local_world_size"):
        assert re.search(rf"^{field} +from the roll call at init \(", table.stdout, re.M), (
            table.stdout
        )
    assert re.search(r"^num_nodes +2$", table.stdout, re.M), table.stdout
    data = json.loads(run_cli("info", "--json", env=env).stdout)
    assert (data["local_rank"], data["local_world_size"], data["node_rank"]) == (1, None, None)


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
    assert re.search(r"^launcher +pytorch$", result.stdout, re.M), result.stdout
    assert "chosen: innermost launcher detected" in result.stdout
    assert re.search(r"^  slurm +detected", result.stdout, re.M)


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
        main(["info", "--launcher", "condor"])
    assert caught.value.code == 2
    assert "unknown launcher 'condor'" in capsys.readouterr().err


def test_torchrun_alias_is_accepted() -> None:
    """`--launcher torchrun` is the same as `--launcher pytorch`."""
    result = run_cli("info", "--json", "--launcher", "torchrun", env=torchrun.TORCHRUN_4[0])
    assert json.loads(result.stdout)["launcher"] == "pytorch"


def test_master_addr_format_option() -> None:
    """`--master-addr-format '{host}-ib'` maps the step's first host, like the env setting."""
    result = run_cli("info", "--json", "--master-addr-format", "{host}-ib", env=slurm.SRUN_2N_4T[1])
    assert json.loads(result.stdout)["master_addr"] == "n1-ib"


def test_version_prints_the_package_version() -> None:
    """`distenv --version` prints the version the package (and its metadata) carries."""
    import distenv

    result = run_cli("-m", "distenv", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"distenv {distenv.__version__}\n"


def test_template_lists_every_file_of_scripts() -> None:
    """`distenv template` lists each file under scripts/ by its path, with what it is for."""
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    expected = sorted(str(p.relative_to(scripts)) for p in scripts.rglob("*") if p.is_file())
    result = run_cli("template")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.split("\n\n")[0].splitlines()
    listed = [line.split()[0] for line in rows if not line.startswith(" ")]  # not wrapped lines
    assert listed == expected
    assert re.search(
        r"^slurm/single_node\.sbatch +One node, one task per GPU$", result.stdout, re.M
    )


@pytest.mark.parametrize("name", ["slurm/multi_node.sbatch", "multi_node.sbatch", "multi_node"])
def test_template_prints_the_file_byte_for_byte(name: str) -> None:
    """`distenv template NAME` prints scripts/NAME exactly; a unique file name or stem will do."""
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    result = run_cli("template", name)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (scripts / "slurm" / "multi_node.sbatch").read_text()


def test_template_unknown_name_lists_the_templates() -> None:
    """An unknown template name is a DistEnvError (exit 1) that names every template."""
    result = run_cli("template", "condor")
    assert result.returncode == 1
    assert result.stderr.startswith("distenv: template: no template 'condor'. Hint: name one of: ")
    assert "slurm/single_node.sbatch" in result.stderr


def test_a_part_of_a_name_finds_its_one_template_or_names_those_it_could_mean() -> None:
    """``single`` is part of one template's name: that one is printed. ``multi`` is part of two:
    both are named (0.2.0.dev: "no template 'multi'")."""
    single = run_cli("template", "single")
    assert single.returncode == 0, single.stderr
    assert single.stdout.startswith("#!/bin/bash\n# One node, one task per GPU")
    multi = run_cli("template", "multi")
    assert multi.returncode == 1
    assert multi.stderr.startswith(
        "distenv: template: 'multi' is ambiguous (slurm/multi_node.sbatch, "
        "slurm/multi_node_torchrun.sbatch). Hint: name one of: "
    )


def test_the_template_list_shows_whole_summaries() -> None:
    """Each template's first clause, wrapped under its column, never cut with "..."."""
    listed = run_cli("template")
    assert listed.returncode == 0
    assert "..." not in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 100
    flat = " ".join(listed.stdout.split())
    assert (
        "slurm/requeue_array.sbatch A job array whose elements each save a checkpoint shortly "
        "before their time limit, requeue themselves alone (not the whole array) and resume in "
        "their next run"
    ) in flat


def test_info_shows_cuda_visible_devices_and_leaves_torch_unloaded() -> None:
    """Plain `distenv info` shows CUDA_VISIBLE_DEVICES and does not import torch (seconds on a
    login node); the device row says how to ask for it."""
    code = (
        "import sys; from distenv.cli import main; main(['info']); main(['info', '--json']); "
        "print('torch loaded:', 'torch' in sys.modules)"
    )
    result = run_cli("-c", code, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert result.returncode == 0, result.stderr
    assert re.search(r"^cuda_visible_devices +'2,3'$", result.stdout, re.M), result.stdout
    assert re.search(r"^device +not checked: pass --device \(imports torch\)$", result.stdout, re.M)
    data = json.loads(result.stdout.splitlines()[-2])
    assert data["cuda_visible_devices"] == "2,3"
    assert "device" not in data
    assert result.stdout.endswith("torch loaded: False\n")


def test_info_device_shows_the_device_init_dist_would_select_and_why() -> None:
    """`distenv info --device` applies init_dist's device rule: on this CPU-only torch, cpu,
    no visible device, gloo, and the reason names the CPU-only build."""
    import torch

    result = run_cli("info", "--device", "--json", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cuda_visible_devices"] == "0"
    assert (data["device"], data["visible_devices"], data["backend"]) == (None, 0, "gloo")
    assert data["device_reason"] == (
        f"cpu: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    )
    text = run_cli("info", "--device", env={"CUDA_VISIBLE_DEVICES": ""})
    assert text.returncode == 0, text.stderr
    assert re.search(r"^cuda_visible_devices +''$", text.stdout, re.M), text.stdout
    assert re.search(r"^device +cpu$", text.stdout, re.M)
    assert re.search(r"^visible_devices +0$", text.stdout, re.M)
    assert re.search(r"^  device +cpu: torch .* is a CPU-only build", text.stdout, re.M)


def test_launcher_slurm_on_a_login_node_says_how_to_submit() -> None:
    """`distenv info --launcher slurm` outside any job: exit 1, the hint says sbatch/srun first."""
    result = run_cli("info", "--launcher", "slurm")
    assert result.returncode == 1
    assert result.stderr.startswith("distenv: slurm: none of its variables are set"), result.stderr
    hint = result.stderr.split(". Hint: ", 1)[1]
    assert hint.startswith("submit it: `sbatch job.sbatch` whose script runs `srun python"), hint
    assert hint.index("srun -N 2") < hint.index("--launcher none")


@pytest.mark.parametrize("argv", [["template"], ["info"], ["info", "--json"]])
def test_a_reader_that_stops_early_ends_the_report_quietly(argv: list[str]) -> None:
    """`distenv template | head -1`: the reader is gone before the command writes, and the command
    exits 0 with nothing on stderr (0.2.0.dev: a BrokenPipeError traceback and status 1, fatal
    under ``set -o pipefail``)."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "distenv", *argv],
        stdout=write,
        stderr=subprocess.PIPE,
        env=scrubbed_environ(),
    )
    os.close(write)
    os.close(read)  # before the command has written anything: its first write fails
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err == b""


def test_a_bad_timeout_is_refused_by_info_and_once_by_run(tmp_path: Path) -> None:
    """``DISTENV_TIMEOUT=abc``: `distenv info` refuses it as init_dist and doctor do (0.2.0.dev:
    exit 0, silent), and `distenv run -n 2` refuses it once, before starting any rank (0.2.0.dev:
    every rank started and failed on its own)."""
    env = {**scrubbed_environ(), "DISTENV_TIMEOUT": "abc"}
    info = subprocess.run([sys.executable, "-m", "distenv", "info"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert info.returncode == 1
    assert "$DISTENV_TIMEOUT is 'abc', expected a positive number of seconds" in info.stderr
    started = tmp_path / "started"
    run = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", "--no-python", "touch", str(started)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("$DISTENV_TIMEOUT is 'abc'") == 1, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not started.exists()


def _page_sample(command: str, page: str = "cli.md") -> list[str]:
    """Return the lines docs/`page` shows after the console line that starts with `command`."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"$ {command}"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    return lines[start + 1 : end]


def test_cli_page_samples_are_what_the_commands_print() -> None:
    """docs/cli.md's `info --json` and `export` samples and docs/master.md's `info --json` with
    DISTENV_MASTER_ADDR_FORMAT (rank 3 of srun_2n_4t) are the commands' output for that capture,
    field for field: a new field or a re-recorded capture fails here."""
    env = slurm.SRUN_2N_4T[3]

    def printed(env: dict[str, str]) -> object:
        # The container is this machine's (docker where /.dockerenv exists), not the capture's: the
        # pages show a bare node's.
        return {**json.loads(run_cli("info", "--json", env=env).stdout), "container": None}

    [shown] = _page_sample("distenv info --json")
    assert json.loads(shown) == printed(env)
    assert (
        _page_sample('eval "$(distenv export)"') == run_cli("export", env=env).stdout.splitlines()
    )
    # docs/master.md's sample of DISTENV_MASTER_ADDR_FORMAT, likewise.
    [mapped] = _page_sample("distenv info --json", "master.md")
    formatted = {**env, "DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}
    assert json.loads(mapped) == printed(formatted)


def _builtin_names() -> list[str]:
    """Return every built-in launcher but none, in detection order: what a laptop lacks."""
    from distenv.launchers.registry import BUILTINS

    return [launcher.name for launcher in BUILTINS if launcher.name != "none"]


def test_launchers_not_detected_share_one_line_unless_verbose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a laptop `info` names the 16 launchers not detected on one line, not 16 (#43 item 6);
    --verbose lists each (doctor shares the writer: its sample's test below runs it)."""
    names = _builtin_names()
    summary = f"  not detected: {', '.join(names)} (no variables; --verbose lists each)"
    assert main(["info"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "not detected" in line] == [summary], out
    assert "  none chosen: no launcher detected, running as a single process" in out
    assert main(["info", "--verbose"]) == 0
    verbose = capsys.readouterr().out.splitlines()
    absent = [line.split()[0] for line in verbose if line.endswith("not detected: no variables")]
    assert absent == names, verbose
    assert build_parser().parse_args(["doctor", "-v"]).verbose


#: The pages' `distenv info` samples and the recorded environment each was printed for.
INFO_SAMPLES = [
    ("index.md", "$ srun -N 2 --ntasks-per-node 2 distenv info", slurm.SRUN_2N_4T[3]),
    ("start/slurm.md", "$ srun --mpi=pmix -n 4 distenv info", slurm.SRUN_PMIX_4[1]),
    ("start/lsf.md", "launcher              lsf", None),
    (
        "start/mpi.md",
        "$ sbatch -N 2 --ntasks-per-node 2 --wrap 'mpirun -np 4",
        mpi.OMPI_IN_SBATCH[3],
    ),
]


@pytest.mark.parametrize(("page", "first", "env"), INFO_SAMPLES, ids=[s[0] for s in INFO_SAMPLES])
def test_info_samples_are_what_info_prints(
    page: str,
    first: str,
    env: dict[str, str] | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pages' `distenv info` samples are its output for their recorded environment, on a
    bare node (container none); a sample that elides the table with `...` is checked from `how
    it was chosen:` on."""
    from tests.support.envs import lsf

    lines = (Path(__file__).resolve().parents[2] / "docs" / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    start += 0 if first.startswith("launcher") else 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    shown = lines[start:end]
    for name, value in (env if env is not None else lsf.JSRUN_CORAL_RANK7).items():
        monkeypatch.setenv(name, value)
    assert main(["info"]) == 0
    printed = capsys.readouterr().out
    expected = [
        "container             none" if line.startswith("container ") else line
        for line in printed.splitlines()
    ]
    if "..." in shown:
        shown = shown[shown.index("how it was chosen:") :]
        expected = expected[expected.index("how it was chosen:") :]
    assert shown == expected


def test_a_cli_hint_quotes_the_job_s_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`distenv info --launcher mpi` in a 4-rank torchrun job is told `mpirun -np 4`, its own
    size; the script stays the example's, the command being distenv itself (#43 item 5)."""
    for name, value in torchrun.TORCHRUN_4[1].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "3")  # not the example's 4: the number must come from here
    assert main(["info", "--launcher", "mpi", "--no-resolve"]) == 1
    err = capsys.readouterr().err
    assert "`mpirun -np 3 python train.py ...` (Open MPI) or `mpiexec -n 3 python" in err, err
