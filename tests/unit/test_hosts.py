"""Nodelists and tasks-per-node lists: cases from other projects' bug reports, and properties."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import hostlist
import pytest
from hypothesis import given
from hypothesis import strategies as st

from distenv._hosts import (
    MAX_HOSTS,
    check_hostname,
    count_hosts,
    expand_nodelist,
    expand_tasks_per_node,
)
from distenv.errors import InvalidVariableError


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        # Lightning #9707-style lists with commas inside brackets.
        ("linux[1,2]", ["linux1", "linux2"]),
        ("rack[1-2]-node[3-4]", ["rack1-node3", "rack1-node4", "rack2-node3", "rack2-node4"]),
        ("node[001-003,005]", ["node001", "node002", "node003", "node005"]),
        ("gpu-a100-01,cpu[7-8]", ["gpu-a100-01", "cpu7", "cpu8"]),
        ("n1", ["n1"]),
        ("node.cluster.org", ["node.cluster.org"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    """Nodelists expand in Slurm's order, zero padding kept."""
    assert expand_nodelist("slurm", "SLURM_STEP_NODELIST", nodelist) == hosts
    assert count_hosts(nodelist) == len(hosts)


@pytest.mark.parametrize(
    "bad",
    [
        "node[1-",
        "node[[1]]",
        "node]1[",
        "node[3-1]",
        "node[a-b]",
        "a,,b",
        "node 1",
        "n1;rm -rf /",
        "$(reboot)",
        "`id`",
        "n[1-2]|cat",
        "",
    ],
)
def test_malformed_nodelists_raise(bad: str) -> None:
    """Malformed lists and shell metacharacters raise InvalidVariableError naming the variable."""
    with pytest.raises(InvalidVariableError) as caught:
        expand_nodelist("slurm", "SLURM_STEP_NODELIST", bad)
    assert caught.value.variable == "SLURM_STEP_NODELIST"
    assert caught.value.value == bad
    assert str(caught.value).startswith("slurm: $SLURM_STEP_NODELIST is ")


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("a" * 63, "a" * 63),  # RFC 1123's longest label
        (".".join(["a" * 63] * 3 + ["a" * 61]), ".".join(["a" * 63] * 3 + ["a" * 61])),  # 253
        ("node.cluster.org.", "node.cluster.org."),  # fully qualified, with the root's dot
        ("10.0.0.4", "10.0.0.4"),
        ("fe80::1", "fe80::1"),
        ("[fe80::1]", "fe80::1"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("::ffff:10.0.0.1", "::ffff:10.0.0.1"),
    ],
)
def test_check_hostname_accepts_names_and_addresses(value: str, host: str) -> None:
    """Host names within RFC 1123's limits and IP addresses pass, IPv6 brackets stripped."""
    assert check_hostname("pytorch", "MASTER_ADDR", value) == host


@pytest.mark.parametrize(
    "bad",
    [
        "a" * 254,  # issue #25: names over 253 characters were accepted
        ".".join(["a" * 63] * 4),  # 255 characters in labels of 63
        "a" * 64,  # one label over 63
        "node." + "b" * 64,
        ".",
        "a..b",
        ".node",
        "10.0.0.4:6105",  # issue #25: a host with a port is no IPv6 address
        "10.0.0.4:6105:7",
        ":::::",
        "fe80::1%",
        "host name",
        "[]",
    ],
)
def test_check_hostname_refuses_what_no_host_is_named(bad: str) -> None:
    """Over-long names and labels, empty labels and host:port are refused, naming the variable."""
    with pytest.raises(InvalidVariableError) as caught:
        check_hostname("kubeflow", "PET_MASTER_ADDR", bad)
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "kubeflow",
        "PET_MASTER_ADDR",
        bad,
    )


@pytest.mark.parametrize("bad", ["n" * 254, "n[1-2]," + "a" * 64, "rack" + "x" * 70 + "[1-3]"])
def test_nodelist_hosts_keep_rfc_1123_limits(bad: str) -> None:
    """A nodelist naming a host over 253 characters (or a label over 63) is refused."""
    with pytest.raises(InvalidVariableError, match="RFC 1123") as caught:
        expand_nodelist("slurm", "SLURM_STEP_NODELIST", bad)
    assert caught.value.variable == "SLURM_STEP_NODELIST"


def test_nodelist_with_a_huge_node_number_is_refused() -> None:
    """A node number of thousands of digits is malformed, not a ValueError from int()."""
    with pytest.raises(InvalidVariableError):
        expand_nodelist("slurm", "SLURM_STEP_NODELIST", "n[" + "1" * 5000 + "]")


def test_huge_nodelist_is_counted_not_expanded() -> None:
    """A 40-byte list naming 10^18 hosts is refused fast and without allocating them."""
    bomb = "n[0-999999999][0-999999999]"
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(InvalidVariableError, match=f"at most {MAX_HOSTS} hosts"):
        expand_nodelist("slurm", "SLURM_JOB_NODELIST", bomb)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 1_000_000


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("4(x2)", [4, 4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,2,3", [1, 2, 3]),
        ("8", [8]),
    ],
)
def test_expand_tasks_per_node(text: str, counts: list[int]) -> None:
    """Slurm's compressed tasks-per-node lists expand per node."""
    assert expand_tasks_per_node("slurm", "SLURM_STEP_TASKS_PER_NODE", text) == counts


@pytest.mark.parametrize(
    "bad", ["", "2(x)", "(x2)", "2x3", "-1", "0", "2(x0)", "2(x3", "a", "1(x99999999)", "2;id"]
)
def test_malformed_tasks_per_node_raise(bad: str) -> None:
    """Malformed or absurd tasks-per-node lists raise InvalidVariableError."""
    with pytest.raises(InvalidVariableError) as caught:
        expand_tasks_per_node("slurm", "SLURM_STEP_TASKS_PER_NODE", bad)
    assert caught.value.variable == "SLURM_STEP_TASKS_PER_NODE"


names = st.from_regex(r"[a-z]{1,5}", fullmatch=True)
ranges = st.tuples(st.integers(0, 50), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1]))


@given(prefix=names, spans=st.lists(ranges, min_size=1, max_size=4), suffix=names | st.just(""))
def test_count_matches_python_hostlist(
    prefix: str, spans: list[tuple[int, int]], suffix: str
) -> None:
    """The bracket arithmetic agrees with python-hostlist's own expansion."""
    group = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)
    text = f"{prefix}[{group}]{suffix}"
    try:
        expected = len(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist:
        return
    total = sum(b - a + 1 for a, b in spans)
    if expected != total:  # overlapping ranges: hostlist drops duplicates, we count them
        return
    assert count_hosts(text) == expected
    assert len(expand_nodelist("slurm", "V", text)) == expected


@given(
    st.lists(st.text(alphabet="abcXY019._-", min_size=1, max_size=6), min_size=1, max_size=8).map(
        ",".join
    )
)
def test_a_list_without_ranges_expands_as_hostlist_does(text: str) -> None:
    """A nodelist without brackets, split without python-hostlist, gives hostlist's hosts: the
    names in order, each once."""
    assert expand_nodelist("slurm", "SLURM_NODELIST", text) == hostlist.expand_hostlist(text)


def test_a_list_without_ranges_does_not_import_hostlist() -> None:
    """A one-node (or bracket-free) nodelist costs no import of python-hostlist; a range does."""
    code = (
        "import sys; from distenv._hosts import expand_nodelist as e; "
        "print(e('slurm', 'V', 'vm,gpu-2,vm'), 'hostlist' in sys.modules); "
        "print(e('slurm', 'V', 'n[1-2]'), 'hostlist' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == ["['vm', 'gpu-2'] False", "['n1', 'n2'] True"]


@given(st.text(max_size=40))
def test_any_text_either_expands_or_raises_invalid(text: str) -> None:
    """Whatever the value, the parser returns hosts or raises InvalidVariableError; nothing else."""
    try:
        hosts = expand_nodelist("slurm", "SLURM_NODELIST", text)
    except InvalidVariableError:
        return
    assert 1 <= len(hosts) <= MAX_HOSTS


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 9)), min_size=1, max_size=6))
def test_tasks_per_node_roundtrip(items: list[tuple[int, int]]) -> None:
    """Any list Slurm could write expands to the counts it encodes."""
    text = ",".join(f"{n}(x{r})" if r > 1 else str(n) for n, r in items)
    expected = [n for n, r in items for _ in range(r)]
    assert expand_tasks_per_node("slurm", "SLURM_TASKS_PER_NODE", text) == expected


@given(st.text(max_size=30))
def test_tasks_per_node_any_text(text: str) -> None:
    """Arbitrary text yields positive counts or InvalidVariableError."""
    try:
        counts = expand_tasks_per_node("slurm", "SLURM_TASKS_PER_NODE", text)
    except InvalidVariableError:
        return
    assert counts
    assert all(c >= 1 for c in counts)
