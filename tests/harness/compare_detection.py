"""Compare what two versions of distenv detect, case by case: a refactoring's safety net.

Runs `distenv.explain` under every launcher name on every captured rank (every module of
tests/support/envs), each also perturbed (MASTER_* given, a stale DISTENV_SCOPE, an address format, an
arbitrary distribution, malformed values), once with the working tree and once with a git
revision (materialised with `git archive`, never checked out), and prints every case whose answer
differs: the RankInfo, the export tag (DISTENV_SCOPE), the reasons, or the error's type, message
and reasons.

    .venv/bin/python tests/harness/compare_detection.py --baseline a124b84
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DUMP = r"""
import json, logging, sys
sys.path.append(sys.argv[1])  # tests.support.envs, after PYTHONPATH's distenv
import importlib, pkgutil
import distenv
import tests.support.envs

logging.disable(logging.CRITICAL)
envs = []
for module in sorted(m.name for m in pkgutil.iter_modules(tests.support.envs.__path__)):
    m = importlib.import_module(f"tests.support.envs.{module}")
    for n in sorted(dir(m)):
        value = getattr(m, n)
        if not n.isupper():
            continue
        ranks = list(value) if isinstance(value, (tuple, list)) else [value]
        envs += [(f"{module}.{n}[{i}]", e) for i, e in enumerate(ranks) if isinstance(e, dict)]
extra = [{}, {"MASTER_ADDR": "h9"}, {"MASTER_PORT": "4444"},
         {"MASTER_ADDR": "h9", "MASTER_PORT": "4444", "DISTENV_SCOPE": "slurm/3/0"},
         {"DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}, {"SLURM_DISTRIBUTION": "arbitrary"},
         {"MASTER_PORT": "99999"}, {"DISTENV_MASTER_ADDR_FORMAT": "bad"},
         {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "x", "MASTER_PORT": "5"},
         {"PMI_SIZE": "x", "OMPI_COMM_WORLD_SIZE": "0", "SLURM_NTASKS": "x"},
         {"PMI_RANK": "x", "OMPI_COMM_WORLD_RANK": "x", "SLURM_PROCID": "x", "RANK": "x"}]
out = {"__file__": distenv.__file__}
for name, env in envs:
    for k, add in enumerate(extra):
        for launcher in ("auto", *distenv.launchers.BUILTIN):
            try:
                d = distenv.explain(launcher, {**env, **add})
                tag = getattr(d, "job_tag", None) or d.scope
                r = {"info": d.info.to_dict(), "scope": tag, "launcher": d.launcher.name,
                     "considered": [list(c) for c in d.considered]}
            except distenv.DistEnvError as exc:
                r = {"error": type(exc).__name__, "message": str(exc),
                     "considered": [list(c) for c in exc.considered]}
            out[f"{name}+{k}/{launcher}"] = r
print(json.dumps(out))
"""


def dump(source: Path) -> dict[str, object]:
    """Return every case's answer with the distenv found under `source`."""
    result = subprocess.run(
        [sys.executable, "-c", DUMP, str(REPO)],
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        cwd=source,  # with -c the current directory comes before PYTHONPATH
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    answers: dict[str, object] = json.loads(result.stdout)
    found = Path(str(answers.pop("__file__"))).parent.parent
    if found.resolve() != source.resolve():
        sys.exit(f"imported distenv from {found}, not {source}")
    return answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.baseline, "distenv"],
            capture_output=True,
            check=True,
        ).stdout
        archive_path = Path(tmp) / "baseline.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(tmp, filter="data")
        old, new = dump(Path(tmp)), dump(REPO)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    for key in differ:
        print(f"{key}\n  {args.baseline}: {old.get(key)}\n  working tree: {new.get(key)}")
    print(f"{len(old)} cases; {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
