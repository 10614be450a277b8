"""MkDocs hook: render reference tables from distenv's own declarations.

A page writes a marker such as ``<!-- env-table: slurm -->``; `on_page_markdown` replaces it with a
table built from the same data the code uses (a launcher's ``variables``, `RankInfo.to_env`, the
``distenv`` argument parser, ...), so the documentation cannot drift from the parser. An unknown
marker is an error, which fails ``mkdocs build --strict``.

The sections a reader of the repository needs (the CLI's help, the refused torchrun options, the
launchers' variables, the MPI libraries, the settings, the detection order) are also committed
into the Markdown, between the marker and ``<!-- end: KIND -->``, so that docs/ read on a code
host shows them. The site renders them afresh; ``python docs/sections.py`` rewrites them after a
change, and tests/meta/test_docs.py fails while a committed section differs from its rendering.

Pure Python: importing this module needs distenv, not mkdocs (tests/meta/test_docs.py imports it).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distenv.variables import Var

__all__ = [
    "MARKER",
    "SECTION",
    "expand_markers",
    "on_page_markdown",
    "render",
    "render_cli_help",
    "render_detection_order",
    "render_env_exports",
    "render_env_table",
    "render_fault_matrix",
    "render_layers",
    "render_mpi_flavors",
    "render_refused_flags",
    "render_restart_kinds",
    "render_restart_matrix",
    "render_scripts",
    "render_settings_table",
    "subcommands",
]

MARKER = re.compile(r"<!--\s*([a-z-]+)(?::\s*([^<>]*?))?\s*-->")
# The characters a code block's line holds on the site: 78 in Material's narrowest two-column and
# three-column layouts (960 and 1220 px wide), 80 on wider screens, measured in Chromium. The help
# blocks do not wrap again (extra.css, cli-help), so argparse's own wrapping is all there is.
HELP_WIDTH = 78
REPO = Path(__file__).resolve().parent.parent


def _cell(text: str) -> str:
    """Escape the pipes of a table cell that would split it (those outside code spans).

    Python-Markdown's tables keep a pipe inside backticks as it is, but show a backslash there.
    """
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _var_table(variables: Sequence[Var], what: str = "fills") -> str:
    """Return the Markdown table of `Var` declarations, in declaration order."""
    rows = [
        f"| variable | {what} | required | meaning |",
        "|---|---|---|---|",
    ]
    for var in variables:
        field = var.field if var.field.startswith("(") or " " in var.field else f"`{var.field}`"
        rows.append(
            f"| `{var.name}` | {_cell(field)} | {_cell(var.required)} | {_cell(var.meaning)} |"
        )
    return "\n".join(rows) + "\n"


def render_env_table(name: str) -> str:
    """Return the Markdown table of the variables launcher `name` declares, in declaration order."""
    from distenv.launchers.registry import get_launcher

    launcher = get_launcher(name)
    if not launcher.variables:
        return f"The `{launcher.name}` launcher reads no environment variable.\n"
    return _var_table(launcher.variables)


def render_settings_table() -> str:
    """Return the table of distenv's own settings: the master's DISTENV_* and `SETTINGS`."""
    from distenv.master import MASTER_VARS
    from distenv.settings import SETTINGS

    own = [var for var in MASTER_VARS if var.name.startswith("DISTENV_")]
    return _var_table([*own, *SETTINGS], what="affects")


def render_env_exports() -> str:
    """Return the table of what `RankInfo.to_env` exports, each key with its RankInfo field."""
    from distenv.master import SCOPE_VAR
    from distenv.rankinfo import RankInfo

    # Distinct values for every field, so each exported value names the field it came from.
    sample = RankInfo(
        launcher="slurm",
        rank=7,
        world_size=11,
        local_rank=1,
        local_world_size=3,
        node_rank=2,
        num_nodes=4,
        master_addr="host0",
        master_port=29999,
    )
    by_value = {str(value): field for field, value in sample.to_dict().items()}
    rows = ["| exported variable | value |", "|---|---|"]
    for key, value in sample.to_env().items():
        rows.append(f"| `{key}` | `RankInfo.{by_value[value]}` |")
    rows.append(
        f"| `{SCOPE_VAR}` | the job step the values belong to: `launcher/job/step` "
        "(`-` where there is none), e.g. `slurm/4/0` |"
    )
    return "\n".join(rows) + "\n"


def render_mpi_flavors() -> str:
    """Return the table of MPI libraries the `mpi` launcher recognises, in the order it tries them."""
    from distenv.launchers.mpi import FLAVORS

    def names(value: str | tuple[str, ...]) -> str:
        items = (value,) if isinstance(value, str) else value
        return " or ".join(f"`{n}`" for n in items) or "(none)"

    rows = [
        "| library | rank | world_size | local_rank | local_world_size | node_rank |",
        "|---|---|---|---|---|---|",
    ]
    for flavor in FLAVORS:
        rows.append(
            f"| {flavor.name} | {names(flavor.rank)} | {names(flavor.size)} | "
            f"{names(flavor.local_rank)} | {names(flavor.local_size)} | "
            f"{names(flavor.node) if flavor.node else 'the roll call (0 when local = world size)'} |"
        )
    return "\n".join(rows) + "\n"


def render_detection_order() -> str:
    """Return the auto-detection order as an ordered list (launchers, then schedulers)."""
    from distenv.launchers import Scheduler
    from distenv.launchers.registry import BUILTIN, DETECTION_ORDER
    from distenv.settings import PLUGINS_VAR

    spawners = [n for n in DETECTION_ORDER if not isinstance(BUILTIN[n], Scheduler)]
    schedulers = [n for n in DETECTION_ORDER if isinstance(BUILTIN[n], Scheduler)]
    lines = [f"1. plug-in launchers named in `{PLUGINS_VAR}` (in the order given)"]
    lines += [f"1. `{name}`" for name in spawners]
    lines.append(f"1. plug-in schedulers (`Scheduler`) named in `{PLUGINS_VAR}`")
    lines += [f"1. `{name}`" for name in schedulers]
    lines.append("1. `none`: nothing detected, a single process")
    return "\n".join(lines) + "\n"


def render_layers() -> str:
    """Return the layers of pyproject.toml's import-linter contracts, each module with its summary.

    The top contract's layers come first; a subpackage with a layers contract of its own (its
    ``containers``) has its inner layers listed under it, numbered ``3.1``, ``3.2``, ...
    """
    import ast
    import importlib.util

    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    (top,) = [c for c in contracts if "containers" not in c]
    inner = {c["containers"][0]: c["layers"] for c in contracts if "containers" in c}

    def summary(name: str) -> str:
        spec = importlib.util.find_spec(name)  # read, not imported: __main__ would run
        origin = spec.origin if spec is not None else None
        tree = ast.parse(Path(origin).read_text()) if origin else None
        doc = (ast.get_docstring(tree) if tree else None) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    rows = ["| layer (imports point down) | module | what it holds |", "|---|---|---|"]
    for index, layer in enumerate(top["layers"], start=1):
        for name in re.split(r"\s*[|:]\s*", layer.split("#")[0].strip()):
            rows.append(f"| {index} | `{name}` | {_cell(summary(name))} |")
            for sub, sublayer in enumerate(inner.get(name, ()), start=1):
                for module in re.split(r"\s*[|:]\s*", sublayer):
                    full = f"{name}.{module}"
                    rows.append(f"| {index}.{sub} | `{full}` | {_cell(summary(full))} |")
    return "\n".join(rows) + "\n"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Return the ``distenv`` command's subcommand parsers by name."""
    from distenv.cli import build_parser

    parser = build_parser()
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render_cli_help(name: str) -> str:
    """Return ``distenv NAME --help`` as a fenced block, formatted at a fixed width.

    The block is a ``text`` block of class ``cli-help``, which the site's CSS leaves unwrapped:
    argparse's wrapping keeps the options' hanging indent, a browser's would not.
    """
    if name == "":
        from distenv.cli import build_parser

        parser = build_parser()
    else:
        found = subcommands()
        if name not in found:
            raise KeyError(f"no distenv subcommand {name!r} (have: {', '.join(found)})")
        parser = found[name]
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH)
    return "```{.text .cli-help}\n" + parser.format_help().rstrip() + "\n```\n"


def render_refused_flags() -> str:
    """Return the table of torchrun options ``distenv run`` refuses, with what to do instead."""
    from distenv.local.options import REFUSED_FLAGS

    rows = ["| torchrun option | instead |", "|---|---|"]
    for flag in REFUSED_FLAGS:
        spelled = f"`{flag.flag}`" + (f" (`{flag.short}`)" if flag.short else "")
        rows.append(f"| {spelled} | {_cell(flag.hint)} |")
    return "\n".join(rows) + "\n"


def render_scripts(_: str = "") -> str:
    """Return the job templates shipped in the package: a table, then each file, folded.

    Read through `distenv.cli.templates`, the package data `distenv template` prints, so the page
    shows exactly what pip users get.
    """
    from distenv.cli import templates

    rows = ["| template | what it is for |", "|---|---|"]
    folded: list[str] = []
    for name in templates.names():
        rows.append(f"| [`{name}`](#{_anchor(name)}) | {_cell(templates.description(name))} |")
        body = "\n".join(
            f"    {line}" if line else "" for line in templates.read(name).splitlines()
        )
        folded += [
            f"### {name} {{#{_anchor(name)}}}",
            "",
            f"`distenv template {name}` prints it; it is `scripts/{name}` in the repository.",
            "",
            f'??? example "{name}"',
            "",
            "    ```bash",
            body,
            "    ```",
            "",
        ]
    return "\n".join(rows) + "\n\n" + "\n".join(folded)


def _anchor(name: str) -> str:
    """Return the heading id of template `name` on the page (``slurm-single_node``)."""
    return re.sub(r"[^a-z0-9_]+", "-", name.rsplit(".", 1)[0].lower())


def _results(path: str) -> dict[str, Any]:
    """Return a benchmark's JSON results (`path` from the repository's root)."""
    import json

    results: dict[str, Any] = json.loads((REPO / path).read_text(encoding="utf-8"))
    return results


def _measured(data: dict[str, Any]) -> str:
    """Return ``Measured on <date> (<cpu>, <n> CPUs; torch <v>; git <commit>)`` of a benchmark."""
    m = data["machine"]
    return (
        f"Measured on {m['date']} ({m['cpu_model']}, {m['logical_cpus']} CPUs; torch "
        f"{m['torch']}; git {m['git_commit']})"
    )


def render_fault_matrix(path: str) -> str:
    """Return the fault matrix table from benchmarks/lab/fault_matrix.py's JSON (repository path)."""
    data = _results(path)
    rows = [
        f"{_measured(data)}, one run of each fault, {data['total_s']:g} s in all.",
        "",
        "| fault | launcher | bound | measured | exits (launcher; ranks) | message (excerpt) |",
        "|---|---|---|---|---|---|",
    ]
    for rec in data["faults"].values():
        ranks = ", ".join(f"{r}: {how}" for r, how in rec["rank_exits"].items())
        exits = f"{rec['launcher_exit']}" + (f"; {ranks}" if ranks else "")
        measured = "n/a" if rec["measured_s"] is None else f"{rec['measured_s']:.1f} s"
        if "exited_s" in rec:
            measured += f" (process gone {rec['exited_s']:.1f} s)"
        left = f" **{len(rec['survivors'])} left running**" if rec["survivors"] else ""
        rows.append(
            f"| {_cell(rec['fault'])} | {_cell(rec['launcher'])} | {rec['bound_s']:g} s "
            f"| {measured}{left} | {_cell(exits)} | {_cell(rec['excerpt'])} |"
        )
    return "\n".join(rows) + "\n"


def render_network_matrix(path: str) -> str:
    """Return the network matrix, bare torch against distenv, from benchmarks/lab/network_matrix.py's
    JSON (repository path)."""
    data = _results(path)
    rows = [
        f"{_measured(data)}, one run of each, {data['total_s']:g} s in all; "
        f"a hang is killed at {data['bound_s']:g} s. Passed: bare {data['passed']['bare']}, "
        f"distenv {data['passed']['distenv']} of {len(data['topologies'])}.",
        "",
        "| topology | from | bare `env://` | distenv |",
        "|---|---|---|---|",
    ]

    def outcome(run: dict[str, Any]) -> str:
        if run["passed"]:
            return f"passed, {run['seconds']:g} s"
        errors = [r for r in run["ranks"] if r["error"]]
        first = min(errors, key=lambda r: r["seconds"]) if errors else None
        said = f": rank {first['rank']}: {first['error'][:160]}" if first else ""
        return f"**failed**, {run['seconds']:g} s{said}"

    for name, rec in data["topologies"].items():
        rows.append(
            f"| {name} | {_cell(rec['report'])} | {_cell(outcome(rec['bare']))} "
            f"| {_cell(outcome(rec['distenv']))} |"
        )
    return "\n".join(rows) + "\n"


def render_restart_kinds() -> str:
    """Return the table of failure kinds ``distenv run --max-restarts`` retries or not."""
    from distenv.local.attempts import KINDS, WHY_NOT

    said = {
        "exception": "any other exception, or `sys.exit` with a status but argparse's",
        "refused": "a distenv refusal: detection, configuration, master address, requeue, "
        "the roll call's verdict",
        "import": "an `ImportError` or `SyntaxError` (the script or a module it imports)",
        "usage": "the script's `argparse` refusing its arguments (its `error()`)",
        "stopped": "KeyboardInterrupt; a rank killed by SIGINT, SIGTERM or SIGHUP from outside",
        "crashed": "a rank killed by any other signal (SIGKILL of the OOM killer, SIGSEGV)",
        "agent": "a node's agent gone silent",
    }
    rows = ["| failure | restarted | why not |", "|---|---|---|"]
    for kind, retried in KINDS.items():
        rows.append(
            f"| {_cell(said[kind])} | {'yes' if retried else 'no'} | {_cell(WHY_NOT.get(kind, ''))} |"
        )
    return "\n".join(rows) + "\n"


def render_restart_matrix(path: str) -> str:
    """Return the restart matrix, distenv against torchrun, from benchmarks/lab/restart_matrix.py's
    JSON (repository path)."""
    data = _results(path)
    rows = [
        f"{_measured(data)}: {data['crashes']} failures of {data['nproc']} ranks per launcher, "
        f"{data['total_s']:g} s in all.",
        "",
        "| launcher | passed | attempts | miscounted | orphans | recovery p50 / p95 | of which: "
        "the failed attempt's ranks all gone | the launcher's restart | the last rank's own "
        "start |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(values: dict[str, float]) -> str:
        return f"{values['median']:.2f} / {values['p95']:.2f} s"

    for name, rec in data["launchers"].items():
        rows.append(
            f"| {name} | {'yes' if rec['passed'] else '**no**'} | {rec['attempts']} "
            f"| {len(rec['miscounted'])} | {len(rec['orphans'])} | {spread(rec['recovery_s'])} "
            f"| {spread(rec['stopped_s'])} | {spread(rec['restart_s'])} "
            f"| {spread(rec['rank_start_s'])} |"
        )
    if "recovery_ratio_median" in data:
        rows += ["", f"Median recovery, distenv / torchrun: {data['recovery_ratio_median']:.2f}."]
    return "\n".join(rows) + "\n"


RENDERERS: dict[str, Callable[[str], str]] = {
    "env-table": render_env_table,
    "env-exports": lambda _: render_env_exports(),
    "mpi-flavors": lambda _: render_mpi_flavors(),
    "detection-order": lambda _: render_detection_order(),
    "settings-table": lambda _: render_settings_table(),
    "layers": lambda _: render_layers(),
    "cli-help": render_cli_help,
    "run-refused-flags": lambda _: render_refused_flags(),
    "scripts": render_scripts,
    "fault-matrix": render_fault_matrix,
    "network-matrix": render_network_matrix,
    "restart-kinds": lambda _: render_restart_kinds(),
    "restart-matrix": render_restart_matrix,
    # Which test runs the next code block, or why none does, and which tests back a "checked
    # with" sentence (tests/support/docblocks.py, enforced by tests/meta/test_docs.py): nothing on the page.
    "run": lambda _: "",
    "not-run": lambda _: "",
    "backed-by": lambda _: "",
}


#: A committed section: the marker, its rendering as committed, the end marker.
SECTION = re.compile(
    r"(?P<marker><!--\s*(?P<kind>[a-z-]+)(?::\s*(?P<arg>[^<>]*?))?\s*-->)\n"
    r"(?P<body>.*?)<!--\s*end:\s*(?P=kind)\s*-->",
    re.DOTALL,
)


def render(kind: str, arg: str, marker: str) -> str:
    """Return the Markdown of `marker` (of `kind`, with `arg`); refuse an unknown kind."""
    renderer = RENDERERS.get(kind)
    if renderer is None:
        raise ValueError(f"unknown docs marker {marker!r} (known: {', '.join(RENDERERS)})")
    return renderer(arg)


def expand_markers(markdown: str) -> str:
    """Replace every ``<!-- kind: arg -->`` marker of `markdown` with its rendered Markdown.

    A committed section (the marker, its rendering, ``<!-- end: kind -->``) is rendered afresh.

    Raises:
        ValueError: For a marker this hook does not know, so that a typo fails the build.
    """
    markdown = SECTION.sub(
        lambda m: render(m.group("kind"), m.group("arg") or "", m.group("marker")), markdown
    )

    return MARKER.sub(lambda m: render(m.group(1), m.group(2) or "", m.group(0)), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """MkDocs event: expand the markers of one page."""
    return expand_markers(markdown)
