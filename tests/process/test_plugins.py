"""Third-party launcher backends through the `distenv.launchers` entry-point group."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ

PLUGIN = '''
from distenv.variables import Var
from distenv.launchers.base import Launcher
from distenv.rankinfo import RankInfo


class AcmeLauncher(Launcher):
    """A site launcher: ACME_TASK_RANK / ACME_JOB_SIZE (a toy for the test)."""

    name = "acme"
    variables = (
        Var("ACME_TASK_RANK", "rank", "yes", "task rank"),
        Var("ACME_JOB_SIZE", "world_size", "yes", "tasks"),
    )

    def detect(self, env):
        return self.reader(env).has("ACME_TASK_RANK")

    def rank_info(self, env):
        reader = self.reader(env)
        rank, size = reader.integer("ACME_TASK_RANK"), reader.integer("ACME_JOB_SIZE", minimum=1)
        return RankInfo(launcher=self.name, rank=rank, world_size=size, local_rank=rank,
                        local_world_size=size, node_rank=0, num_nodes=1,
                        master_addr="acmehost", master_port=4711)
'''

PROBE = """
import json, sys, distenv
out = {"info": distenv.detect(sys.argv[1]).to_dict(),
       "metadata_loaded": "importlib.metadata" in sys.modules}
print(json.dumps(out))
"""


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A directory holding an installed-looking plug-in distribution."""
    (tmp_path / "distenv_acme.py").write_text(PLUGIN)
    info = tmp_path / "distenv_acme-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: distenv-acme\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[distenv.launchers]\nacme = distenv_acme:AcmeLauncher\n"
    )
    return tmp_path


def run_probe(code: str, path: Path, launcher: str, env: dict[str, str]) -> dict[str, object]:
    """Run `code` in a clean interpreter that finds the plug-ins under `path`; return its JSON."""
    result = subprocess.run(
        [sys.executable, "-c", code, launcher],
        env={**scrubbed_environ(), "PYTHONPATH": str(path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def probe(path: Path, launcher: str, **env: str) -> dict[str, object]:
    return run_probe(PROBE, path, launcher, {"ACME_TASK_RANK": "1", "ACME_JOB_SIZE": "2", **env})


def test_plugin_by_explicit_name(plugin_path: Path) -> None:
    """`--launcher acme` loads the plug-in through its entry point."""
    out = probe(plugin_path, "acme")
    assert out["info"]["launcher"] == "acme"  # type: ignore[index]
    assert out["info"]["rank"] == 1  # type: ignore[index]


def test_auto_does_not_scan_plugins_by_default(plugin_path: Path) -> None:
    """Default auto detection never scans entry points (it costs tens of ms)."""
    out = probe(plugin_path, "auto")
    assert out["info"]["launcher"] == "none"  # type: ignore[index]
    assert out["metadata_loaded"] is False


def test_opted_in_plugin_is_tried_before_builtins(plugin_path: Path) -> None:
    """Plug-ins listed in DISTENV_PLUGINS come first in auto detection."""
    out = probe(plugin_path, "auto", DISTENV_PLUGINS="acme", SLURM_JOB_ID="5", SLURM_NTASKS="1")
    assert out["info"]["launcher"] == "acme"  # type: ignore[index]


# The site PBS scheduler of docs/plugins.md, a distribution of its own in examples/plugin, written
# against the public contract only. PBS and Cray PALS cannot be installed here: the environments
# below follow the recorded ones of tests/support/envs/pbs.py.
PBS_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugin"
PALS_RANK5_OF_8 = {
    "PALS_RANKID": "5",
    "PMI_RANK": "5",
    "PMI_SIZE": "8",
    "PALS_LOCAL_RANKID": "1",
    "PALS_LOCAL_SIZE": "4",
    "PALS_NODEID": "1",
}
PBS_PROBE = """
import json, sys, distenv
from distenv import DistEnvError
try:
    detection = distenv.explain(sys.argv[1])
except DistEnvError as exc:
    print(json.dumps({"error": type(exc).__name__, "source": exc.source, "message": str(exc)}))
else:
    print(json.dumps({"info": detection.info.to_dict(), "considered": detection.considered}))
"""


@pytest.fixture(scope="module")
def pbs_installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PBS plug-in, built and installed by pip into a directory of its own."""
    work = tmp_path_factory.mktemp("pbs")
    source = work / "src"
    shutil.copytree(PBS_PLUGIN, source)  # building writes build/ and *.egg-info beside the code
    target = work / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--no-index", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "distenv_pbs-1.0.dist-info" / "entry_points.txt").is_file()
    return target


def pbs_probe(site: Path, launcher: str, env: dict[str, str]) -> dict[str, object]:
    return run_probe(PBS_PROBE, site, launcher, env)


def nodefile(tmp_path: Path, *hosts: str) -> str:
    path = tmp_path / "nodefile"
    path.write_text("".join(f"{host}\n" for host in hosts))
    return str(path)


def test_pbs_scheduler_plugin_gives_mpi_ranks_the_allocation_master(
    pbs_installed: Path, tmp_path: Path
) -> None:
    """PALS ranks in a PBS job take the master from the site plug-in's allocation, like Slurm's."""
    from distenv.launchers import scheduler_port

    job = {"PBS_JOBID": "812.pbs01", "PBS_NODEFILE": nodefile(tmp_path, *["x1", "x2"] * 4)}
    out = pbs_probe(pbs_installed, "auto", {**PALS_RANK5_OF_8, **job, "DISTENV_PLUGINS": "sitepbs"})
    info = out["info"]
    assert info["launcher"] == "mpi"  # type: ignore[index]
    # PALS_NODEID names the node; no variable counts the nodes: the roll call does, at init.
    assert (info["rank"], info["node_rank"], info["num_nodes"]) == (5, 1, None)  # type: ignore[index]
    assert info["master_addr"] == "x1"  # type: ignore[index]
    assert info["master_port"] == scheduler_port("812.pbs01", "mpi")  # type: ignore[index]
    assert ["sitepbs", "master taken from its allocation: x1"] in out["considered"]  # type: ignore[operator]
    # Not opted in: no entry-point scan; the built-in pbs backend leaves the master to mpi4py.
    alone = pbs_probe(pbs_installed, "auto", {**PALS_RANK5_OF_8, **job})
    assert alone["info"]["master_addr"] is None  # type: ignore[index]


def test_pbs_scheduler_plugin_refuses_the_batch_script(pbs_installed: Path, tmp_path: Path) -> None:
    """The job script of a multi-slot PBS job is refused as rank 0 of N; one slot is rank 0 of 1."""
    job = {"PBS_JOBID": "813.pbs01", "DISTENV_PLUGINS": "sitepbs"}
    many = pbs_probe(pbs_installed, "auto", {**job, "PBS_NODEFILE": nodefile(tmp_path, "x1", "x2")})
    assert (many["error"], many["source"]) == ("NotLaunchedError", "sitepbs")
    assert "rank 0 of 2" in str(many["message"])
    one = pbs_probe(pbs_installed, "sitepbs", {**job, "PBS_NODEFILE": nodefile(tmp_path, "x1")})
    assert one["info"]["world_size"] == 1  # type: ignore[index]
    assert one["info"]["master_addr"] == "127.0.0.1"  # type: ignore[index]


def test_pbs_plugin_uses_the_public_contract_only() -> None:
    """The plug-in imports distenv's public modules only: no private module, no internal one."""
    tree = ast.parse((PBS_PLUGIN / "distenv_pbs.py").read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("distenv")
    }
    assert imported == {"distenv", "distenv.errors", "distenv.launchers"}
