"""The release artefacts, as a pip user gets them: built, checked, installed into a fresh venv.

One module-scoped build (`python -m build --no-isolation`: this venv's setuptools, no download)
of the sdist and the wheel; `twine check` on both; the metadata pip and PyPI show; the wheel
installed non-editable with ``--no-deps`` into a fresh venv that borrows torch and
python-hostlist from this venv's site-packages (a ``.pth`` line: nothing is downloaded), where
``distenv --version``, ``distenv info``, ``distenv template`` and the README's example run from
the installed copy, outside the repository.
"""

from __future__ import annotations

import email.parser
import re
import site
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import distenv
from tests.conftest import scrubbed_environ

pytestmark = pytest.mark.slow  # out of a bare pytest's fast lane (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
VERSION = distenv.__version__


def _run(argv: list[str | Path], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"$ {argv}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Built:
    """The artefacts of one build, and a fresh venv with the wheel installed."""

    wheel: Path
    sdist: Path
    venv: Path
    work: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Build the sdist and the wheel once; install the wheel into a fresh venv."""
    work = tmp_path_factory.mktemp("packaging")
    dist = work / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO], cwd=work)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
    _run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], cwd=work)
    # torch and python-hostlist from this venv, without its editable distenv (a .pth in a
    # directory added by a .pth is not processed).
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    (purelib / "borrowed-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return Built(wheel, sdist, venv, work)


def test_twine_check_passes(built: Built) -> None:
    """Both artefacts pass `twine check` (metadata and README rendering)."""
    out = _run([sys.executable, "-m", "twine", "check", built.wheel, built.sdist], cwd=built.work)
    assert out.count("PASSED") == 2, out


def test_metadata_is_release_grade(built: Built) -> None:
    """SPDX licence expression and no licence classifier, project URLs, Python classifiers."""
    with zipfile.ZipFile(built.wheel) as whl:
        text = whl.read(f"distenv-{VERSION}.dist-info/METADATA").decode()
    meta = email.parser.Parser().parsestr(text, headersonly=True)
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "MIT"
    assert meta["License"] is None
    classifiers = meta.get_all("Classifier") or []
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert {"Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.11"} <= (
        set(classifiers)
    )
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Documentation", "Source", "Issues", "Changelog"} <= set(urls)


def test_wheel_requires_numpy(built: Built) -> None:
    """numpy is a dependency: torch's wheel does not declare it but warns in every rank without
    it, and `pip install .` is how the README installs distenv."""
    with zipfile.ZipFile(built.wheel) as whl:
        text = whl.read(f"distenv-{VERSION}.dist-info/METADATA").decode()
    requires = email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist")
    assert "numpy" in (requires or []), requires


def test_changelog_has_an_entry_for_the_version() -> None:
    """A release version has its own `## [X.Y.Z] - date` section; a `.devN` version is the
    Unreleased section, which says which release it becomes."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    release = re.fullmatch(r"(\d+\.\d+\.\d+)(?:\.dev\d+)?", VERSION)
    assert release, VERSION
    if release.group(1) == VERSION:
        assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d\d-\d\d$", changelog, re.M)
    else:
        unreleased = changelog.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
        assert f"{release.group(1)} (`distenv --version`: {VERSION})" in unreleased


def test_wheel_and_sdist_ship_exactly_the_templates_of_scripts(built: Built) -> None:
    """Every file of scripts/ is in both artefacts, byte for byte, as package data."""
    expected = {
        str(p.relative_to(SCRIPTS)): p.read_bytes() for p in SCRIPTS.rglob("*") if p.is_file()
    }
    with zipfile.ZipFile(built.wheel) as whl:
        shipped = {
            name.removeprefix("distenv/scripts/"): whl.read(name)
            for name in whl.namelist()
            if name.startswith("distenv/scripts/")
        }
    assert shipped == expected
    root = f"distenv-{VERSION}/distenv/scripts/"
    with tarfile.open(built.sdist) as sdist:
        members = {m.name.removeprefix(root): m for m in sdist if m.name.startswith(root)}
        files = {name: m for name, m in members.items() if m.isfile()}
        assert {name: sdist.extractfile(m).read() for name, m in files.items()} == expected  # type: ignore[union-attr]


def test_every_slurm_template_ends_the_step_when_a_rank_fails() -> None:
    """Every `srun` of the Slurm templates carries --kill-on-bad-exit=1, as the README's line does:
    one crashed rank ends the step instead of leaving the others blocked in a collective."""
    templates = sorted((SCRIPTS / "slurm").glob("*.sbatch"))
    assert templates
    for path in templates:
        runs = [line for line in path.read_text().splitlines() if line.startswith("srun ")]
        assert runs, path.name
        for line in runs:
            assert "--kill-on-bad-exit=1" in line, f"{path.name}: {line}"


def test_sdist_carries_no_tests(built: Built) -> None:
    """The sdist is for building: no half test tree that cannot collect (see MANIFEST.in)."""
    with tarfile.open(built.sdist) as sdist:
        names = sdist.getnames()
    assert not [n for n in names if "/tests/" in n], names
    assert f"distenv-{VERSION}/distenv/cli/__init__.py" in names


def test_installed_wheel_runs_the_cli_and_the_readme_example(built: Built) -> None:
    """From the fresh venv, outside the repository: --version, info, template, and the
    README's first example under `distenv run -n 2`, all from the installed copy."""
    bin_ = built.venv / "bin"
    where = _run([bin_ / "python", "-c", "import distenv; print(distenv.__file__)"], built.work)
    assert where.startswith(str(built.venv)), where
    assert _run([bin_ / "distenv", "--version"], built.work) == f"distenv {VERSION}\n"
    info = _run([bin_ / "distenv", "info"], built.work)
    assert re.search(r"^launcher +none$", info, re.M), info
    listing = _run([bin_ / "distenv", "template"], built.work)
    assert "slurm/single_node.sbatch" in listing
    printed = _run([bin_ / "distenv", "template", "slurm/single_node.sbatch"], built.work)
    assert printed == (SCRIPTS / "slurm" / "single_node.sbatch").read_text()

    readme = (REPO / "README.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "init_dist" in b)
    (built.work / "train.py").write_text(example)
    # --prefix-output: each rank's lines arrive whole (two ranks' print() on one pipe interleave).
    out = _run(
        [bin_ / "distenv", "run", "-n", "2", "--prefix-output", "train.py"], built.work, timeout=180
    )
    ranks = sorted(re.findall(r"^\[rank \d\] (\d) 2 (\d) 127\.0\.0\.1$", out, re.M))
    assert ranks == [("0", "0"), ("1", "1")], out
