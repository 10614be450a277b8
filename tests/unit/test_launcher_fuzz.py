"""Every declared variable of every built-in launcher, fuzzed: a value is accepted or named.

Each case starts from an environment recorded for the launcher (tests/support/envs), replaces one
variable it declares with an arbitrary, huge or hostile value, and asks detection and every hook
of the launcher. Each answers or raises a `DistEnvError` in one line that names the variable (where
that hook answered the recorded environment); never another exception. The launchers and their
variables come from the registry, so a new variable is fuzzed without a new line here. Derandomized
with fixed example counts: the same values every run, so this file cannot flake.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distenv import DistEnvError, detect
from distenv.launchers import AllocationLauncher, Launcher, Scheduler
from distenv.launchers.registry import BUILTIN
from tests.support.envs import recorded

Call = Callable[[Mapping[str, str]], object]

# A value os.environ can hold: any text but NUL, undecodable bytes as lone surrogates
# (surrogateescape, U+DC80..U+DCFF).
CHARS = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)) | st.characters(
    min_codepoint=0xDC80, max_codepoint=0xDCFF
)
# Pieces that the launchers' formats are made of: separators, brackets, signs, digits, JSON.
PIECES = st.sampled_from(
    [
        *("", " ", ",", ":", ";", ".", "-", "+", "_", "/", "*", "=", "%", "\n", "\t"),
        *("[", "]", "(", ")", "{", "}", "(x", '"', "'", "$(", "`"),
        *("0", "1", "-1", "9" * 30, "1e3", "0x1", "\uff11", "\u0663", "\udcff"),
        *("a", "n1", "node[1-2]", "10.0.0.4", "fe80::1", "algo-1", "a" * 64, "\u0192"),
        *("true", "false", "null", "Y", "N", "auto", "block", "plane=4", "[]"),
    ]
)
# ("set", value) replaces the value; ("wrap", prefix, suffix) surrounds the recorded one;
# ("repeat", separator, n) repeats it n times.
Edit = tuple[str, str, str, int]
EDITS: st.SearchStrategy[Edit] = st.one_of(
    st.tuples(st.just("set"), st.text(CHARS, max_size=40), st.just(""), st.just(0)),
    st.tuples(st.just("set"), st.lists(PIECES, max_size=12).map("".join), st.just(""), st.just(0)),
    st.tuples(st.just("set"), st.integers(-(10**25), 10**25).map(str), st.just(""), st.just(0)),
    st.tuples(st.just("wrap"), PIECES, PIECES, st.just(0)),
    st.tuples(st.just("wrap"), st.text(CHARS, max_size=4), st.text(CHARS, max_size=4), st.just(0)),
    st.tuples(st.just("repeat"), PIECES, st.just(""), st.integers(0, 2000)),
)


def _edit(value: str, edit: Edit) -> str:
    kind, first, second, count = edit
    if kind == "wrap":
        return first + value + second
    if kind == "repeat":
        return first.join([value] * count)
    return first


def _calls(launcher: Launcher) -> dict[str, Call]:
    """Detection (auto and by name) and every hook of `launcher`, by name."""
    calls: dict[str, Call] = {
        "detect(auto)": lambda env: detect("auto", env),
        "detect(name)": lambda env: detect(launcher.name, env),
        "detect": launcher.detect,
        "rank_info": launcher.rank_info,
        "world": launcher.world,
        "scope": launcher.scope,
        "restart_count": launcher.restart_count,
        "default_master": launcher.default_master,
        "node_agent": launcher.node_agent,
        "processes_per_node": launcher.processes_per_node,
    }
    if isinstance(launcher, Scheduler):
        calls.update(
            allocation_master=launcher.allocation_master,
            daemon_nodes=launcher.daemon_nodes,
            requeue_command=launcher.requeue_command,
        )
    if isinstance(launcher, AllocationLauncher):
        calls["placed_rank_info"] = lambda env: launcher.placed_rank_info(env, None)
    return calls


def _outcomes(launcher: Launcher, env: Mapping[str, str]) -> frozenset[str]:
    """Return the names of the calls that answer `env` without an error."""
    answered = set()
    for name, call in _calls(launcher).items():
        try:
            call(env)
        except DistEnvError:
            continue
        answered.add(name)
    return frozenset(answered)


# Copied when this module is collected, before any test runs: the bases never depend on which
# tests ran before (a test that changed a recorded environment in place would change them).
RECORDED = [dict(env) for env in recorded().values()]
LAUNCHERS = [launcher for launcher in BUILTIN.values() if launcher.variables]
# By name: Hypothesis derives a derandomized test's seed from its arguments too, and a launcher
# object's repr holds its address, which changes with whatever was imported before.
CASES = [
    pytest.param(launcher.name, var.name, id=f"{launcher.name}-{var.name}")
    for launcher in LAUNCHERS
    for var in launcher.variables
]

# Bases: (environment, the calls that answer it) per launcher, at most BASES each.
BASES = 8


class Bases(dict[str, list[tuple[dict[str, str], frozenset[str]]]]):
    """The bases by launcher name; shown briefly when Hypothesis prints a failing example."""

    def __repr__(self) -> str:
        return f"<bases of {', '.join(self)}>"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Bases:
    """Each launcher's recorded environments that auto detection answers, with their outcomes.

    The host files that PBS, LSF and Grid Engine name are recorded beside their environments;
    they are written here so that the file variables start from a readable file.
    """
    from tests.support.envs import gridengine, lsf, pbs

    folder = tmp_path_factory.mktemp("hostfiles")
    (folder / "nodefile").write_text(pbs.NODES[0] + "\n")
    (folder / "hostfile").write_text(lsf.blaunch_hostfile)
    (folder / "nodefile_2x2").write_text(pbs.nodefile_2x2)
    (folder / "pe_hostfile").write_text(gridengine.pe_hostfile_2x4)
    # The recorded paths do not exist here: each names the file written beside it.
    files = {
        "PBS_NODEFILE": str(folder / "nodefile_2x2"),
        "LSB_DJOB_HOSTFILE": str(folder / "hostfile"),
        "PE_HOSTFILE": str(folder / "pe_hostfile"),
    }
    envs = [
        *({**env, **{k: v for k, v in files.items() if env.get(k)}} for env in RECORDED),
        {**pbs.PBS_SCRIPT, "PBS_NODEFILE": str(folder / "nodefile")},
        {**lsf.BLAUNCH_2X2[2], "LSB_DJOB_HOSTFILE": str(folder / "hostfile")},
        {**lsf.JSRUN_PLAIN_RANK5, "LSB_DJOB_RANKFILE": str(folder / "hostfile")},
    ]
    found = Bases()
    for launcher in LAUNCHERS:
        detected = [env for env in envs if launcher.detect(env)]
        # Spread over the recordings (captures hold every rank of a run), at most BASES of them.
        step = max(1, len(detected) // BASES)
        chosen = []
        for env in detected[::step] + detected:
            answered = _outcomes(launcher, env)
            if "detect(auto)" in answered and all(env is not e for e, _ in chosen):
                chosen.append((env, answered))
            if len(chosen) == BASES:
                break
        found[launcher.name] = chosen
    return found


def test_every_launcher_has_a_recorded_environment(bases: Bases) -> None:
    """The fuzzing starts from a valid environment of every launcher that declares variables."""
    assert sorted(name for name, envs in bases.items() if not envs) == []


def _names(variable: str, message: str) -> bool:
    return re.search(rf"(?<![A-Z0-9_]){re.escape(variable)}(?![A-Z0-9_])", message) is not None


@pytest.mark.parametrize(("launcher_name", "variable"), CASES)
@settings(derandomize=True, max_examples=12, deadline=None, database=None)
@given(index=st.integers(0, 1000), edit=EDITS)
# The shapes issue #25 reproduced, for every variable.
@example(index=0, edit=("set", "[" * 100_000, "", 0))
@example(index=0, edit=("set", "a" * 254, "", 0))
@example(index=0, edit=("set", "10.0.0.4:6105:7", "", 0))
@example(index=0, edit=("set", "-1", "", 0))
@example(index=0, edit=("set", ",,,", "", 0))
@example(index=0, edit=("wrap", "", ":7", 0))
@example(index=0, edit=("set", "9" * 5000, "", 0))
@example(index=0, edit=("set", "x\udcff", "", 0))
# #44 item 11: a digit int() refuses; more than 4300 digits after a separator.
@example(index=0, edit=("set", "\u00b2", "", 0))
@example(index=0, edit=("wrap", "", "#" + "9" * 5000, 0))
def test_any_value_is_accepted_or_named(
    bases: Bases, launcher_name: str, variable: str, index: int, edit: Edit
) -> None:
    """One variable set to any value: every hook answers, or raises a one-line DistEnvError
    naming the variable (where it answered the recorded environment); nothing else escapes."""
    launcher = BUILTIN[launcher_name]
    envs = bases[launcher_name]
    base, answered = envs[index % len(envs)]
    value = _edit(base.get(variable, ""), edit)
    env = {**base, variable: value}
    refused = False
    for name, call in sorted(
        _calls(launcher).items(), key=lambda item: item[0].startswith("detect")
    ):
        try:
            call(env)
        except DistEnvError as exc:
            message = str(exc)
            assert "\n" not in message, (name, message[:300])
            assert len(message) < 2000, (name, message[:300])
            # An empty value is an unset one: the hook may then name what is missing instead,
            # as it may for a variable the recording did not hold (setting it can make another
            # one necessary). Detection names it where the launcher itself refused the value; a
            # value the launcher accepts may still contradict another layer, which detection
            # names.
            named = value and base.get(variable)
            if name in answered and named and (refused or not name.startswith("detect")):
                assert _names(variable, message), (name, message)
            refused = refused or not name.startswith("detect")


def test_the_fuzzed_values_reach_the_parsers() -> None:
    """The edits make values of every kind the issue names: huge, nested, negative, empty."""
    values = [_edit("4", edit) for edit in (("set", "[" * 9, "", 0), ("repeat", ",", "", 3))]
    assert values == ["[" * 9, "4,4,4"]
    assert _names("RANK", "$RANK is 'x'")
    assert not _names("RANK", "$JSM_NAMESPACE_RANK is 'x'")
