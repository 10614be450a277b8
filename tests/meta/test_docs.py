"""The documentation covers what the code declares: variables, errors, subcommands, settings."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import distenv.errors
from distenv.launchers.registry import BUILTIN, DETECTION_ORDER
from distenv.master import PORT_LOW, PORT_SPAN, PORT_STRIDE, scheduler_port
from tests.support import docblocks

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _load(name: str, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, DOCS / name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hooks = _load("hooks.py", "distenv_docs_hooks")
sections = _load("sections.py", "distenv_docs_sections")


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _table_names(table: str) -> list[str]:
    """Return the first-column names (between backticks) of a rendered Markdown table."""
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_env_table_lists_every_declared_variable(name: str) -> None:
    """Each built-in launcher's generated table has one row per declared variable, in order."""
    table = hooks.render_env_table(name)
    declared = [var.name for var in BUILTIN[name].variables]
    assert _table_names(table) == declared
    for var in BUILTIN[name].variables:
        assert var.required in table
        assert var.field in table


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_contract_page_renders_every_launcher(name: str) -> None:
    """The environment-contract page asks the hook for every built-in launcher's table."""
    assert f"<!-- env-table: {name} -->" in _page("contract.md")


def test_plugin_page_contract_table_is_the_contract_namespace() -> None:
    """docs/plugins.md's contract table names exactly `distenv.launchers.__all__`: the names a
    plug-in may import, all documented, and no other."""
    import distenv.launchers

    section = _page("plugins.md").split("## The contract\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])]
    assert sorted(documented) == sorted(distenv.launchers.__all__)


def test_detection_page_says_when_each_launcher_is_detected() -> None:
    """docs/detection.md's "detected when" table has one row per launcher, in detection order."""
    table = _page("detection.md").split("| backend | detected when |\n", 1)[1].split("\n\n", 1)[0]
    assert _table_names(table) == list(DETECTION_ORDER)


def test_env_exports_table_matches_to_env() -> None:
    """The exports table lists every key RankInfo.to_env() writes, plus DISTENV_SCOPE."""
    from distenv.rankinfo import RankInfo

    keys = list(RankInfo.single("none", master_port=1).to_env())
    assert _table_names(hooks.render_env_exports()) == [*keys, "DISTENV_SCOPE"]


@pytest.mark.parametrize("name", distenv.errors.__all__)
def test_every_error_class_is_documented(name: str) -> None:
    """errors.md has a section, with an example message, for every public error class."""
    page = _page("errors.md")
    match = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", page, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, f"errors.md has no '## {name}' section"
    assert "```text" in match.group(1), f"the {name} section shows no example message"


def test_errors_page_documents_no_unknown_class() -> None:
    """Every error section of errors.md names a class that exists."""
    headings = re.findall(r"^## (\w+)$", _page("errors.md"), flags=re.MULTILINE)
    assert set(headings) == set(distenv.errors.__all__)


def test_every_subcommand_is_in_the_cli_reference() -> None:
    """cli.md has a section for every subcommand of `distenv`."""
    page = _page("cli.md")
    names = list(hooks.subcommands())
    assert {"info", "export", "run"} <= set(names)
    for name in names:
        assert f"## `distenv {name}`" in page, f"cli.md has no section for distenv {name}"


@pytest.mark.parametrize("name", ["", *sorted(hooks.subcommands())])
def test_cli_help_renders(name: str) -> None:
    """The hook renders the --help text of the command and of each subcommand."""
    text = hooks.render_cli_help(name)
    assert text.startswith("```{.text .cli-help}\nusage: distenv")


def test_expand_markers_refuses_unknown_marker() -> None:
    """A mistyped marker fails the build instead of vanishing from the page."""
    with pytest.raises(ValueError, match="unknown docs marker"):
        hooks.expand_markers("<!-- env-tabel: slurm -->")


def test_every_marker_in_the_docs_expands() -> None:
    """Every page's markers render (the build would fail on the first that does not)."""
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert "<!-- env-" not in hooks.expand_markers(text), page


def test_committed_sections_are_what_the_site_renders() -> None:
    """The sections committed into the pages (CLI help, refused flags, variable tables, ...) are
    their current rendering: after a change, `python docs/sections.py` rewrites them (#43 item 6)."""
    stale = [
        str(page.relative_to(DOCS))
        for page in sorted(DOCS.rglob("*.md"))
        if sections.with_sections(text := page.read_text(encoding="utf-8")) != text
    ]
    assert stale == [], "run `python docs/sections.py` to rewrite their committed sections"


def test_a_committed_section_renders_afresh_on_the_site() -> None:
    """The site shows the rendering, not what was committed: a stale section still builds right;
    a marker alone gains its section from `with_sections`."""
    fresh = hooks.expand_markers("<!-- run-refused-flags -->")
    stale = "<!-- run-refused-flags -->\n| stale |\n<!-- end: run-refused-flags -->"
    assert hooks.expand_markers(stale) == fresh
    assert sections.with_sections(stale) == sections.with_sections("<!-- run-refused-flags -->")
    assert sections.with_sections("<!-- layers -->") == "<!-- layers -->"  # a site-only section
    # A code host splits a table row at a code span's pipe: committed, it is escaped.
    assert sections.for_code_hosts("| `a | b` | c |\n`x | y`") == "| `a \\| b` | c |\n`x | y`"


def test_pages_with_site_only_sections_say_where_the_site_is() -> None:
    """A page read in the repository that lacks a section the site renders (`:::` API entries,
    a marker not committed) says so at its top, with the one command that builds the site."""
    invisible = {"run", "not-run", "backed-by", "end", *sections.COMMITTED}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        site_only = re.search(r"(?m)^::: ", text) or any(
            m.group(1) not in invisible for m in hooks.MARKER.finditer(text)
        )
        top = "\n".join(text.splitlines()[:6])
        assert not site_only or sections.SITE_NOTE in top, page


def test_port_formula_page_matches_constants() -> None:
    """The port documentation states the constants the code uses."""
    page = _page("master.md")
    for number in (PORT_LOW, PORT_SPAN, PORT_STRIDE, PORT_LOW + PORT_SPAN):
        assert str(number) in page
    assert f"**{scheduler_port('4', '0')}**" in page


def test_settings_table_lists_every_setting() -> None:
    """docs/contract.md's settings table is rendered from distenv.settings.SETTINGS."""
    from distenv.settings import SETTINGS

    names = _table_names(hooks.render_settings_table())
    assert [v.name for v in SETTINGS] == names[-len(SETTINGS) :]
    assert names[:2] == ["DISTENV_SCOPE", "DISTENV_MASTER_ADDR_FORMAT"]


@pytest.mark.parametrize("block", docblocks.python_blocks(), ids=lambda b: b.where)
def test_every_recipe_block_is_run_or_says_why_not(block: docblocks.Block) -> None:
    """A Python block of docs/start/ or migration.md names the tests that run it, or why none does."""
    assert block.kind is not None, (
        f"{block.where}: a Python block needs '<!-- run: tests/...::test_name -->' or "
        "'<!-- not-run: reason -->' on the line before it"
    )
    if block.kind == "not-run":
        assert len(block.arg.split()) >= 3, f"{block.where}: say why the block is not run"
    for test_id in block.tests:
        assert docblocks.names_a_test(test_id), f"{block.where}: no test {test_id}"


@pytest.mark.parametrize("page", docblocks.recipe_pages(), ids=lambda p: p.name)
def test_every_checked_claim_names_its_test(page: Path) -> None:
    """A "checked with"/"tested with"/"measured" paragraph names the existing tests behind it."""
    for claim in docblocks.claims(page):
        assert claim.backed_by, (
            f"{claim.where}: {claim.text[:80]!r}... says it was checked; add "
            "'<!-- backed-by: tests/...::test_name -->' naming the test that checks it"
        )
        for test_id in claim.backed_by:
            assert docblocks.names_a_test(test_id), f"{claim.where}: no test {test_id}"


def test_a_run_marker_is_read_by_the_test_it_names() -> None:
    """`recipe` finds a test's blocks, and refuses a test that no block names."""
    assert docblocks.recipe("tests/integration/test_recipes.py::test_accelerate")
    with pytest.raises(LookupError, match="no python block"):
        docblocks.recipe("tests/integration/test_recipes.py::test_nothing")


def test_claim_and_marker_parsing() -> None:
    """An unmarked block and an unbacked claim are found; markers render to nothing."""
    page = DOCS.parent / ".pytest-docblocks.md"
    page.write_text(
        "Measured here.\n\n```python\nx = 1\n```\n\nChecked with X.\n"
        "<!-- backed-by: tests/meta/test_docs.py::test_claim_and_marker_parsing -->\n",
        encoding="utf-8",
    )
    try:
        found = docblocks.blocks(page)
        claims = docblocks.claims(page)
    finally:
        page.unlink()
    assert [(b.lang, b.kind, b.code) for b in found] == [("python", None, "x = 1\n")]
    assert [(c.line, c.backed_by) for c in claims] == [
        (1, []),
        (7, ["tests/meta/test_docs.py::test_claim_and_marker_parsing"]),
    ]
    assert hooks.expand_markers("a<!-- not-run: needs detectron2 -->b") == "ab"


LISTED = sorted(p for p in DOCS.rglob("*.md") if "how it was chosen:" in p.read_text("utf-8"))


@pytest.mark.parametrize("page", LISTED, ids=[str(p.relative_to(DOCS)) for p in LISTED])
def test_every_how_it_was_chosen_sample_lists_every_launcher_in_order(page: Path) -> None:
    """A `distenv info` sample names every launcher once, those detected on their own lines and
    the others on the `not detected:` line, each in detection order: a launcher added later
    without a regenerated sample would be missing from what the page says was printed."""
    for block in page.read_text("utf-8").split("how it was chosen:\n")[1:]:
        lines = block.split("\n\n", 1)[0].split("```", 1)[0].splitlines()
        detected = [p[0] for p in map(str.split, lines) if len(p) > 1 and p[1] == "detected"]
        [absent] = [line for line in lines if line.startswith("  not detected: ")]
        names = absent.removeprefix("  not detected: ").split(" (", 1)[0].split(", ")
        for group in (detected, names):
            assert group == sorted(group, key=DETECTION_ORDER.index), (page.name, group)
        assert sorted([*detected, *names]) == sorted(DETECTION_ORDER), (page.name, lines)


def test_benchmarks_page_is_its_template_filled_from_the_committed_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/benchmarks.md is benchmarks/report.py's rendering of docs/benchmarks.md.in with the
    JSON results in docs/benchmarks/: the page's words and its numbers cannot drift apart."""
    monkeypatch.syspath_prepend(str(DOCS.parent / "benchmarks"))
    report = importlib.import_module("report")
    page = report.Page(report.TEMPLATE.read_text(encoding="utf-8"), DOCS / "benchmarks")
    assert page.render() == _page("benchmarks.md")
