"""Placement: the topology read from recorded sysfs trees, and each rank's CPUs in every mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from distenv.cli import main
from distenv.errors import ConfigurationError
from distenv.placement.apply import (
    binding_mode,
    chosen_mode,
    far_socket,
    place_ranks,
    rank_devices,
    threads_each,
)
from distenv.placement.binding import MODES, bind
from distenv.placement.cpus import format_cpus, parse_cpus
from distenv.placement.topology import Topology, read_topology
from tests.support.machines import EXPECTED, MACHINES, Machine


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every recorded machine's tree, written once."""
    root = tmp_path_factory.mktemp("machines")
    return {name: machine.write(root / name) for name, machine in MACHINES.items()}


def _devices(machine: Machine, topology: Topology) -> list:
    """Each rank's accelerator, from its own environment (per-rank visibility) or the node's."""
    if not machine.visible:
        found = rank_devices(topology, {}, machine.ranks)
        assert found is not None
        return found
    devices = []
    for rank, (name, value) in enumerate(machine.visible):
        found = rank_devices(topology, {name: value}, machine.ranks)
        assert found is not None
        devices.append(found[rank])
    return devices


def test_at_least_twelve_machines_each_with_every_mode() -> None:
    """The recorded trees cover issue #41's list, each with an answer for every mode."""
    assert len(MACHINES) >= 12
    for name, machine in MACHINES.items():
        assert set(EXPECTED[name]) == set(MODES), name
        assert all(len(cpus) == machine.ranks for cpus in EXPECTED[name].values()), name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(MACHINES))
def test_binding_per_rank(trees: dict[str, Path], name: str, mode: str) -> None:
    """Each local rank gets exactly the CPUs worked out by hand for its machine and mode."""
    machine = MACHINES[name]
    topology = read_topology(trees[name])
    cpus = bind(topology, mode, _devices(machine, topology))
    assert tuple(format_cpus(c) for c in cpus) == EXPECTED[name][mode]


def test_dgx_topology(trees: dict[str, Path]) -> None:
    """A DGX H100's CPUs, cores, sockets, nodes and GPUs; the NIC and the BMC's VGA are no
    accelerators."""
    topology = read_topology(trees["dgx-h100"])
    assert len(topology.online) == 224
    assert len(set(topology.core.values())) == 112
    assert set(topology.package.values()) == {0, 1}
    assert topology.core[112] == 0
    assert topology.package[168] == 1
    assert {n: format_cpus(c) for n, c in topology.nodes.items()} == {
        0: "0-55,112-167",
        1: "56-111,168-223",
    }
    assert [(a.address, a.vendor, a.node) for a in topology.accelerators][:2] == [
        ("0000:18:00.0", "nvidia", 0),
        ("0000:2a:00.0", "nvidia", 0),
    ]
    assert len(topology.accelerators) == 8
    assert not topology.launcher_bound


def test_memory_only_nodes_and_unknown_gpu_node(trees: dict[str, Path]) -> None:
    """Grace Hopper: the HBM nodes have no CPUs; a GPU whose numa_node is -1 has node None."""
    topology = read_topology(trees["grace-hopper"])
    assert sorted(topology.nodes) == list(range(9))
    assert all(not topology.nodes[n] for n in range(1, 9))
    (gpu,) = topology.accelerators
    assert gpu.node is None
    assert format_cpus(gpu.local_cpus) == "0-71"


@pytest.mark.parametrize(
    ("name", "cpuset", "where"),
    [
        pytest.param(
            "slurm-task-v2",
            "8-23,40-55",
            "cgroup v2 /system.slice/slurmstepd.scope/job_42/step_0",
            id="v2-walks-up",
        ),
        pytest.param("cgroup-v1", "0-3,16-19", "cgroup v1 /slurm/uid_1000/job_7/step_0", id="v1"),
        pytest.param("docker-cpuset-v2", "4-11", "cgroup v2 /", id="v2-namespace-root"),
        pytest.param("offline-cpus", "0-2,4-5,7-10,12-15", "cgroup v2 /", id="offline"),
    ],
)
def test_cgroup_cpuset(trees: dict[str, Path], name: str, cpuset: str, where: str) -> None:
    """The cgroup's cpuset is found (v1 and v2, walking up to the cgroup that has the file)."""
    topology = read_topology(trees[name])
    assert topology.cpuset is not None
    assert format_cpus(topology.cpuset) == cpuset
    assert topology.cgroup == where
    assert topology.affinity == topology.allowed


@pytest.mark.parametrize("mode", MODES)
def test_launcher_binding_is_kept(trees: dict[str, Path], mode: str) -> None:
    """An affinity narrower than the cpuset (srun --cpu-bind, mpirun --bind-to) is every rank's,
    whatever the mode, and the plan says why."""
    topology = read_topology(trees["intel-2s-8gpu"], affinity=frozenset({0, 40}))
    assert topology.launcher_bound
    placement = place_ranks(mode, 8, {}, topology=topology)
    assert placement.cpus == (frozenset({0, 40}),) * 8
    assert not placement.bound
    assert placement.note is not None
    assert "keeping that binding" in placement.note
    assert "0,40" in placement.note


def test_far_socket(trees: dict[str, Path]) -> None:
    """A rank whose GPU is on the socket its cpuset does not reach is named (Kubernetes pod)."""
    placement = place_ranks("auto", 2, {}, topology=read_topology(trees["k8s-static"]))
    assert placement.far() == [1]
    assert "far socket" in placement.lines()[1]
    assert "far" not in placement.lines()[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, ["0000:18:00.0", "0000:2a:00.0"], id="all"),
        pytest.param(
            {"CUDA_VISIBLE_DEVICES": "3,1"}, ["0000:5d:00.0", "0000:2a:00.0"], id="ordered"
        ),
        pytest.param({"CUDA_VISIBLE_DEVICES": "2"}, ["0000:3a:00.0", "0000:3a:00.0"], id="one"),
        pytest.param({"CUDA_VISIBLE_DEVICES": ""}, [None, None], id="empty-hides"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "-1"}, [None, None], id="minus-one-hides"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "1,9,2"}, ["0000:2a:00.0"] * 2, id="ends-at-invalid"),
        pytest.param(
            {"ROCR_VISIBLE_DEVICES": "1"}, ["0000:18:00.0", "0000:2a:00.0"], id="other-maker"
        ),
    ],
)
def test_visible_devices(trees: dict[str, Path], env: dict[str, str], expected: list) -> None:
    """The visibility variable picks the ranks' accelerators as CUDA numbers them."""
    topology = read_topology(trees["dgx-h100"])
    devices = rank_devices(topology, env, 2)
    assert devices is not None
    assert [None if d is None else d.address for d in devices] == expected


def test_amd_visibility_nests(trees: dict[str, Path]) -> None:
    """HIP_VISIBLE_DEVICES counts within ROCR_VISIBLE_DEVICES' list."""
    topology = read_topology(trees["frontier-mi250x"])
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "2"}
    devices = rank_devices(topology, env, 1)
    assert devices is not None
    assert devices[0] is not None
    assert devices[0].address == "0000:d9:00.0"


def test_uuids_place_ranks_without_accelerators(trees: dict[str, Path]) -> None:
    """UUIDs cannot be mapped from sysfs: the ranks are placed as without one, and told so."""
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5e3b1a2c-0000-1111-2222-333344445555"}
    topology = read_topology(trees["dgx-h100"])
    assert rank_devices(topology, env, 2) is None
    placement = place_ranks("node", 2, env, topology=topology)
    assert placement.devices == (None, None)
    assert placement.note is not None
    assert "CUDA_VISIBLE_DEVICES" in placement.note
    assert [format_cpus(c) for c in placement.cpus] == ["0-55,112-167", "56-111,168-223"]


def test_own_device_under_per_task_binding(trees: dict[str, Path]) -> None:
    """A rank that sees one GPU of eight (srun --gpus-per-task=1) assumes the others hold the
    rest in PCI order, and uses its own for itself."""
    topology = read_topology(trees["dgx-h100"])
    own = topology.accelerators[6]
    placement = place_ranks(
        "exclusive", 8, {"CUDA_VISIBLE_DEVICES": "6"}, topology=topology, own=(6, own)
    )
    assert format_cpus(placement.cpus[6]) == "84-97,196-209"
    assert format_cpus(placement.cpus[0]) == "0-13,112-125"


def test_threads_each(trees: dict[str, Path]) -> None:
    """Unbound ranks share the cores they may use: 112 cores over 8 ranks is 14 each."""
    topology = read_topology(trees["dgx-h100"])
    assert threads_each(topology, 8) == 14
    assert threads_each(topology, 500) == 1
    placement = place_ranks("exclusive", 8, {}, topology=topology)
    assert [placement.threads(r) for r in range(8)] == [14] * 8


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("node", "node"),
        (" Core_Complex ", "core-complex"),
        ("none", None),
        ("", None),
        (None, None),
    ],
)
def test_binding_mode(value: str | None, expected: str | None) -> None:
    """Modes are torchrun's spellings (either separator), plus auto and none."""
    assert binding_mode("init", value) == expected


def test_binding_mode_refused() -> None:
    """An unknown mode names the variable, its value and the choices."""
    with pytest.raises(ConfigurationError) as caught:
        binding_mode("distenv run", "numa", "DISTENV_CPU_BINDING")
    assert caught.value.variable == "DISTENV_CPU_BINDING"
    assert caught.value.value == "numa"
    assert str(caught.value) == (
        "distenv run: $DISTENV_CPU_BINDING is 'numa', expected one of node, socket, exclusive, "
        "core-complex, auto or none. Hint: auto binds each rank near its accelerator (docs: "
        "placement); none leaves the CPUs alone"
    )


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("", set()), ("5", {5}), ("0-3\n", {0, 1, 2, 3})],
)
def test_cpu_lists(text: str, cpus: set[int]) -> None:
    """The kernel's CPU-list format reads and writes back."""
    assert parse_cpus(text) == cpus
    assert format_cpus(frozenset(cpus)) == text.strip()


@pytest.mark.parametrize("text", ["x", "3-1", "1-", "0-99999", "1,,a"])
def test_bad_cpu_lists(text: str) -> None:
    """What is not a CPU list reads as None, never as some CPUs."""
    assert parse_cpus(text) is None


def test_live_node() -> None:
    """This machine reads too: its affinity is within its online CPUs."""
    topology = read_topology()
    assert topology.affinity <= topology.online
    assert topology.allowed
    assert topology.affinity


def test_far_socket_is_named(trees: dict[str, Path]) -> None:
    """doctor's check: a rank whose CPUs are all on the other socket than its GPU is told why and
    how to fix it; one beside its GPU, or without one, is not."""
    topology = read_topology(trees["k8s-static"])
    message = far_socket(topology, {}, 1)
    assert message is not None
    assert message.startswith(
        "its CPUs (2-5,26-29) are all on another socket than its accelerator 0000:b1:00.0 "
        "(NUMA node 1)"
    )
    assert "Hint: bind near it" in message
    assert far_socket(topology, {}, 0) is None
    assert far_socket(topology, {}, None) is None
    assert far_socket(topology, {"CUDA_VISIBLE_DEVICES": "0"}, 0) is None


def test_info_topology(trees: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`distenv info --topology --sysfs DIR` prints the node and each local rank's CPUs; the
    number of ranks defaults to the accelerators."""
    assert main(["info", "--topology", "--sysfs", str(trees["frontier-mi250x"])]) == 0
    out = capsys.readouterr().out
    assert "numa node 3: 48-63,112-127" in out
    assert "accelerator 0: 0000:c1:00.0 amd, numa node 3" in out
    assert "binding 'auto' of 8 local ranks:" in out
    assert "local rank 0: cpus 49-55,113-119 (7 cores), accelerator 0000:c1:00.0" in out
    argv = ["info", "--sysfs", str(trees["k8s-static"]), "--numa-binding", "node"]
    assert main([*argv, "--nproc-per-node", "2"]) == 0
    out = capsys.readouterr().out
    assert "local rank 1: cpus 2-5,26-29 (4 cores), accelerator 0000:b1:00.0 (far socket)" in out


@pytest.mark.parametrize(
    "argv",
    [["--sysfs", "/nonexistent"], ["--nproc-per-node", "0"], ["--numa-binding", "numa"]],
)
def test_info_topology_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A missing tree, no ranks or an unknown mode is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as caught:
        main(["info", "--topology", *argv])
    assert caught.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_chosen_mode() -> None:
    """The argument wins over $DISTENV_CPU_BINDING; a bad setting names the variable."""
    assert chosen_mode("init", "node", "auto") == "node"
    assert chosen_mode("init", None, "auto") == "auto"
    assert chosen_mode("init", None, None) is None
    with pytest.raises(ConfigurationError, match=r"cpu_binding='x'"):
        chosen_mode("init", "x", None)
    with pytest.raises(ConfigurationError, match=r"\$DISTENV_CPU_BINDING is 'x'"):
        chosen_mode("init", None, "x")


def test_the_placement_page_shows_info_topology_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/placement.md's `distenv info --topology --sysfs frontier/` block is the command's
    output for the recorded Frontier node."""
    MACHINES["frontier-mi250x"].write(tmp_path / "frontier")
    monkeypatch.chdir(tmp_path)
    assert main(["info", "--topology", "--sysfs", "frontier/"]) == 0
    printed = capsys.readouterr().out
    page = (Path(__file__).resolve().parents[2] / "docs" / "placement.md").read_text()
    command = "$ distenv info --topology --sysfs frontier/"
    start = page.index("\n", page.index(command)) + 1
    assert page[start : page.index("```", start)] == printed


def test_own_device_despite_uuids(trees: dict[str, Path]) -> None:
    """A rank that knows its own GPU (init_dist asks torch) is placed by it even where
    CUDA_VISIBLE_DEVICES names UUIDs, and nothing is said about them."""
    topology = read_topology(trees["dgx-h100"])
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5e3b1a2c-0000-1111-2222-333344445555"}
    own = (0, topology.accelerators[5])
    placement = place_ranks("node", 1, env, topology=topology, own=own)
    assert placement.note is None
    assert [format_cpus(c) for c in placement.cpus] == ["56-111,168-223"]
