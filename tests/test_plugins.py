"""Third-party launcher backends through the `distenv.launchers` entry-point group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ

PLUGIN = '''
from distenv._env import Var
from distenv.launchers.base import Launcher
from distenv.rankinfo import RankInfo


class FluxLauncher(Launcher):
    """Flux: FLUX_TASK_RANK / FLUX_JOB_SIZE (a toy subset for the test)."""

    name = "flux"
    variables = (
        Var("FLUX_TASK_RANK", "rank", "yes", "task rank"),
        Var("FLUX_JOB_SIZE", "world_size", "yes", "tasks"),
    )

    def detect(self, env):
        return self.reader(env).has("FLUX_TASK_RANK")

    def rank_info(self, env):
        reader = self.reader(env)
        rank, size = reader.integer("FLUX_TASK_RANK"), reader.integer("FLUX_JOB_SIZE", minimum=1)
        return RankInfo(launcher=self.name, rank=rank, world_size=size, local_rank=rank,
                        local_world_size=size, node_rank=0, num_nodes=1,
                        master_addr="fluxhost", master_port=4711)
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
    (tmp_path / "distenv_flux.py").write_text(PLUGIN)
    info = tmp_path / "distenv_flux-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: distenv-flux\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[distenv.launchers]\nflux = distenv_flux:FluxLauncher\n"
    )
    return tmp_path


def probe(path: Path, launcher: str, **env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, launcher],
        env={
            **scrubbed_environ(),
            "PYTHONPATH": str(path),
            "FLUX_TASK_RANK": "1",
            "FLUX_JOB_SIZE": "2",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_plugin_by_explicit_name(plugin_path: Path) -> None:
    """`--launcher flux` loads the plug-in through its entry point."""
    out = probe(plugin_path, "flux")
    assert out["info"]["launcher"] == "flux"  # type: ignore[index]
    assert out["info"]["rank"] == 1  # type: ignore[index]


def test_auto_does_not_scan_plugins_by_default(plugin_path: Path) -> None:
    """Default auto detection never scans entry points (it costs tens of ms)."""
    out = probe(plugin_path, "auto")
    assert out["info"]["launcher"] == "none"  # type: ignore[index]
    assert out["metadata_loaded"] is False


def test_opted_in_plugin_is_tried_before_builtins(plugin_path: Path) -> None:
    """Plug-ins listed in DISTENV_PLUGINS come first in auto detection."""
    out = probe(plugin_path, "auto", DISTENV_PLUGINS="flux", SLURM_JOB_ID="5", SLURM_NTASKS="1")
    assert out["info"]["launcher"] == "flux"  # type: ignore[index]
