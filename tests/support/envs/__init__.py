"""Environments captured from real launches (and recorded from documentation), and how to compare them."""

from __future__ import annotations

from distenv.rankinfo import RankInfo

# rank, world, local rank, local size, node, nodes (None: left to the roll call)
Layout = tuple[int, int, int, int | None, int | None, int | None]


def layout(info: RankInfo) -> Layout:
    """Return the numbering part of `info`, as the fixtures' expected answers write it."""
    return (
        info.rank,
        info.world_size,
        info.local_rank,
        info.local_world_size,
        info.node_rank,
        info.num_nodes,
    )


def recorded() -> dict[str, dict[str, str]]:
    """Return every recorded environment of every module here, by ``module.NAME[i]``.

    Walks the modules' upper-case constants: an environment (a mapping of strings), or a tuple
    or list of them (one per rank). A module or constant added here reaches every check that
    iterates this (tests/unit/test_declared.py, test_layer.py, test_launcher_fuzz.py) without
    a list to keep; ``*_ANSWERS``, host lists and other data are not environments and are
    skipped by their type.
    """
    import importlib
    import pkgutil

    found: dict[str, dict[str, str]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "make_fixtures":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name in sorted(vars(module)):
            value = vars(module)[name]
            if not name.isupper() or name.startswith("_"):
                continue
            ranks = value if isinstance(value, (tuple, list)) else (value,)
            for i, env in enumerate(ranks):
                if isinstance(env, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in env.items()
                ):
                    found[f"{info.name}.{name}[{i}]"] = env
    return found
