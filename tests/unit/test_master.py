"""Each rule of distenv.master, pinned on environments captured from real launches.

The query is built by the pipeline from the capture, as `init_dist` builds it; the answer names the
rule that gave the address and the port, so a rule that stops applying (or applies out of turn)
fails here by name.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from distenv import master as master_module
from distenv.detection.choice import choose
from distenv.detection.pipeline import master_query
from distenv.errors import ConfigurationError, InvalidVariableError, MissingVariableError
from distenv.master import (
    DEFAULT_PORT,
    MIN_DRAWN,
    PORT_HIGH,
    PORT_LOW,
    Default,
    LocalLaunch,
    Master,
    MasterQuery,
    find_master,
    free_port,
    scheduler_port,
)
from distenv.rankinfo import RankInfo
from tests.support.envs import lsf, mpi, slurm, torchrun


def master(env: Mapping[str, str], launcher: str = "auto", **kwargs: object) -> Master:
    return find_master(master_query(choose(launcher, env)), **kwargs)  # type: ignore[arg-type]


def test_stated_torchrun_contract_is_used_as_given() -> None:
    """Rule 1: torchrun's MASTER_ADDR/MASTER_PORT, whatever DISTENV_SCOPE says."""
    env = torchrun.TORCHRUN_4[1]
    stale_tag = {**env, "DISTENV_SCOPE": "slurm/3/0"}
    for case in (env, stale_tag):
        found = master(case)
        assert found == Master(env["MASTER_ADDR"], int(env["MASTER_PORT"]), "stated", "stated")


def test_explicit_values_win_each_on_its_own() -> None:
    """Rule 2: MASTER_ADDR and MASTER_PORT beat the scheduler's default, each separately."""
    env = slurm.SRUN_2N_4T[3]
    both = master({**env, "MASTER_ADDR": "h9", "MASTER_PORT": "4444"})
    assert both == Master("h9", 4444, "explicit", "explicit")
    port_only = master({**env, "MASTER_PORT": "4444"})
    assert port_only == Master("n1", 4444, "default", "explicit")


def test_explicit_values_are_validated() -> None:
    """Rule 2: a malformed MASTER_PORT is an error naming the launcher and the variable."""
    with pytest.raises(InvalidVariableError, match=r"slurm: \$MASTER_PORT is '99999'"):
        master({**slurm.SRUN_2N_4T[0], "MASTER_PORT": "99999"})


def test_exports_of_another_scope_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """Rule 2: MASTER_* that distenv exported for another job step are stale: the default wins."""
    env = {**slurm.SRUN_2N_4T[3], "MASTER_ADDR": "n7", "MASTER_PORT": "10291"}
    with caplog.at_level(logging.WARNING, logger="distenv"):
        stale = master({**env, "DISTENV_SCOPE": "slurm/3/0"})
    job = env["SLURM_JOB_ID"]  # of the capture
    assert stale == Master("n1", scheduler_port(job, "0"), "default", "default")
    assert f"exported them for slurm/3/0, this is slurm/{job}/0" in caplog.text
    own = master({**env, "DISTENV_SCOPE": f"slurm/{job}/0"})
    assert own == Master("n7", 10291, "explicit", "explicit")


def test_launchers_that_do_not_declare_master_vars_ignore_them() -> None:
    """Rule 2 applies only to launchers declaring MASTER_*: `none` stays on 127.0.0.1."""
    found = master({"MASTER_ADDR": "h9", "MASTER_PORT": "4444"}, "none")
    assert found == Master("127.0.0.1", None, "stated", "unresolved")


def test_default_slurm_step_first_host_and_formula() -> None:
    """Rule 4: an srun step's first host and the port of its job and step."""
    port = scheduler_port(slurm.SRUN_2N_4T[3]["SLURM_JOB_ID"], "0")
    assert master(slurm.SRUN_2N_4T[3]) == Master("n1", port, "default", "default")
    assert scheduler_port("4", "0") == 26269


def _collide(job: int, step: int, jobs: range, steps: range) -> list[tuple[int, int]]:
    """Return the (job + dj, step + ds) pairs of the box whose port is job/step's port."""
    port = scheduler_port(str(job), str(step))
    return [
        (job + dj, step + ds)
        for dj in jobs
        for ds in steps
        if (dj, ds) != (0, 0) and scheduler_port(str(job + dj), str(step + ds)) == port
    ]


def test_port_formula_keeps_related_jobs_apart() -> None:
    """Every "never" of docs/master.md's collision table, and where the guarantee ends."""
    job, step = 50_000, 300
    assert _collide(job, step, range(0, 709), range(-31, 32)) == []
    assert _collide(job, step, range(0, 2134), range(-7, 8)) == []
    assert _collide(job, step, range(0, 4), range(-255, 256)) == []
    assert _collide(job, step, range(22768, 22769), range(-63, 64)) == []
    assert _collide(job, 0, range(0, 1), range(0, 20_000)) == []
    # 0.1.0's collisions are gone: job N step 97 / job N+1 step 0, and ids 22768 apart.
    assert scheduler_port("38", "97") != scheduler_port("39", "0")
    assert scheduler_port("38", "0") != scheduler_port(str(38 + 22768), "0")
    # The bounds are tight: one more job apart and some pair in the box collides.
    assert _collide(job, step, range(709, 710), range(-31, 32)) != []
    assert all(10_000 <= scheduler_port(str(j), "0") < 32_768 for j in range(0, 100_000, 7))


def test_default_slurm_batch_script_is_local() -> None:
    """Rule 4: a 1-task batch script is rank 0 of 1 on 127.0.0.1, port from the job."""
    env = slurm.SBATCH_BATCH_1T[0]
    found = master(env)
    port = scheduler_port(env["SLURM_JOB_ID"], "batch")
    assert found == Master("127.0.0.1", port, "default", "default")


@pytest.mark.parametrize("distribution", ["arbitrary", "plane=4"])
def test_default_arbitrary_distribution_needs_master_addr(distribution: str) -> None:
    """Rule 4: with arbitrary/plane distribution rank 0's host is unknown: MASTER_ADDR required."""
    env = {**slurm.SRUN_2N_4T[3], "SLURM_DISTRIBUTION": distribution}
    with pytest.raises(MissingVariableError, match=r"\$MASTER_ADDR is not set") as info:
        master(env)
    assert info.value.variable == "MASTER_ADDR"
    assert f"--distribution={distribution}" in str(info.value.hint)
    found = master({**env, "MASTER_ADDR": "n2"})
    port = scheduler_port(env["SLURM_JOB_ID"], "0")
    assert found == Master("n2", port, "explicit", "default")


def test_default_lsf_skips_the_coral_launch_node() -> None:
    """Rule 4: LSF's first host that runs ranks (the CORAL launch node holds one slot)."""
    found = master(lsf.JSRUN_CORAL_RANK7)
    assert found.addr == "h22n07"
    assert (found.addr_rule, found.port_rule) == ("default", "default")


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(mpi.OMPI_IN_SALLOC_2N[3], id="openmpi-salloc"),
        pytest.param(mpi.HYDRA_IN_SALLOC_2N[3], id="hydra-salloc"),
        pytest.param(mpi.OMPI_IN_SBATCH[2], id="openmpi-sbatch"),
    ],
)
def test_allocation_master_for_mpi_inside_slurm(env: dict[str, str]) -> None:
    """Rule 5: MPI ranks in an allocation take its first host and a port from the job alone."""
    job = env["SLURM_JOB_ID"]
    assert master(env) == Master("n1", scheduler_port(job, "mpi"), "allocation", "allocation")
    explicit = master({**env, "MASTER_ADDR": "n2"})
    assert explicit == Master("n2", None, "explicit", "unresolved")


def test_format_maps_defaults_and_allocations_never_explicit_values() -> None:
    """Rules 4 and 5 pass their host through DISTENV_MASTER_ADDR_FORMAT; rule 2 does not."""
    fmt = {"DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}
    assert master({**slurm.SRUN_2N_4T[3], **fmt}).addr == "n1-ib"
    assert master({**mpi.OMPI_IN_SALLOC_2N[0], **fmt}).addr == "n1-ib"
    assert master({**slurm.SRUN_2N_4T[3], **fmt, "MASTER_ADDR": "h9"}).addr == "h9"
    with pytest.raises(ConfigurationError, match="expected a template containing"):
        master({**slurm.SRUN_2N_4T[3], "DISTENV_MASTER_ADDR_FORMAT": "%s-ib"})


def test_flags_win_over_the_schedulers_layout() -> None:
    """Rule 3: a local launcher's flags beat the layout it was given, field by field."""
    layout = Default("n1", 26269)
    query = MasterQuery(
        source="run",
        env={},
        flags=(None, 4242),
        default=layout,
        local=LocalLaunch(4, "--master-addr", "h"),
    )
    assert find_master(query, runtime=True) == Master("n1", 4242, "default", "flags")


def test_local_one_node_gets_loopback_and_a_free_port() -> None:
    """Rule 6: a single process, or one local node, binds 127.0.0.1 and a port free there."""
    single = master({}, runtime=True)  # `none` states 127.0.0.1 itself
    local = find_master(MasterQuery("run", {}, local=LocalLaunch(1, "-", "-")), runtime=True)
    for found, addr_rule in ((single, "stated"), (local, "local")):
        assert (found.addr, found.addr_rule, found.port_rule) == ("127.0.0.1", addr_rule, "local")
        assert found.port is not None
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", found.port))  # it really was free


def test_free_ports_are_drawn_below_the_ephemeral_range_and_never_twice() -> None:
    """A free port (distenv run's, rank 0's over MPI) comes from below the kernel's ephemeral
    range, where no outgoing connection or listener is handed it first, never one of torch's
    default ports, and never twice to one process."""
    high = min(PORT_HIGH, master_module._ephemeral_low())
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(PORT_LOW <= port < high for port in ports), sorted(ports)[-3:]
    assert not set(ports) & master_module.TORCH_PORTS


def test_a_drawn_port_that_is_bound_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw that lands on a port something listens on draws again."""
    import secrets

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(master_module, "PORT_LOW", taken - 1)
        monkeypatch.setattr(master_module, "PORT_HIGH", taken + 2 * MIN_DRAWN)
        monkeypatch.setattr(master_module, "_ephemeral_low", lambda: taken + 2 * MIN_DRAWN)
        draws = iter([1, 1, 2])  # taken, taken again, then the port after it
        monkeypatch.setattr(secrets, "randbelow", lambda _: next(draws))
        expected = taken + 1
        assert expected not in master_module._GIVEN
        with socket.socket() as free:
            free.bind(("", expected))  # free now: the draw must find it so
        assert free_port() == expected


def test_the_kernel_picks_where_the_range_below_the_ephemeral_one_is_narrow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An ephemeral range that starts under PORT_LOW + MIN_DRAWN leaves the pick to the kernel;
    the range's first port is read from the kernel's file, PORT_HIGH where it cannot be."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("15000\t60999\n")
    assert master_module._ephemeral_low(str(ranges)) == 15000
    ranges.write_text("garbage")
    assert master_module._ephemeral_low(str(ranges)) == PORT_HIGH
    assert master_module._ephemeral_low(str(tmp_path / "absent")) == PORT_HIGH
    monkeypatch.setattr(master_module, "_ephemeral_low", lambda: PORT_LOW + 10)
    port = free_port()
    assert not PORT_LOW <= port < PORT_LOW + 10
    with socket.socket() as sock:
        sock.bind(("", port))  # the kernel's pick was free


def test_local_several_nodes_need_the_address() -> None:
    """Rule 6: a local launch spanning nodes needs the address given; its port is 29500."""
    local = LocalLaunch(2, "--master-addr", "pass --master-addr on every node")
    with pytest.raises(ConfigurationError, match="2 nodes but no --master-addr") as info:
        find_master(MasterQuery("run", {}, local=local), runtime=True)
    assert info.value.hint == "pass --master-addr on every node"
    given = find_master(MasterQuery("run", {}, flags=("h0", None), local=local), runtime=True)
    assert given == Master("h0", DEFAULT_PORT, "flags", "local")


#: HYDRA_4's rank 2 as if its node held 2 of the 4 ranks: an MPI job on two nodes.
HYDRA_2_NODES = {**mpi.HYDRA_4[2], "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}


def test_mpi_job_without_master_stays_unresolved_in_detection() -> None:
    """Detection (no runtime) leaves the master of an MPI job on several nodes to the exchange."""
    assert master(HYDRA_2_NODES) == Master(None, None)


def _one_node(env: Mapping[str, str], node_port: Callable[[], int | None]) -> MasterQuery:
    """The pipeline's query for `env` (an MPI job on one node), with `node_port` in place of the
    run-time one (which asks whether mpi4py imports)."""
    query = master_query(choose("auto", env))
    assert query.node_port is not None, "one node: the pipeline sets node_port"
    return query._replace(node_port=node_port)


def _no_exchange(rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
    raise AssertionError("a one-node job with a node port needs no exchange")


@pytest.mark.parametrize(
    "ranks",
    [
        pytest.param(mpi.OMPI_4, id="openmpi4"),
        pytest.param(mpi.OMPI5_3, id="openmpi5"),
    ],
)
def test_one_node_mpi_job_without_mpi4py_takes_loopback_and_a_port_from_its_launch(
    ranks: tuple[dict[str, str], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 6: mpirun on one machine (local size = world size) without mpi4py: every rank takes
    127.0.0.1 and one port from PMIX_NAMESPACE, without talking; MASTER_* still win."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` raises ImportError
    port = scheduler_port(ranks[0]["PMIX_NAMESPACE"], "mpi")
    for env in ranks:
        found = master(env, runtime=True, exchange=_no_exchange)
        assert found == Master("127.0.0.1", port, "local", "local")
    other = {**ranks[0], "PMIX_NAMESPACE": ranks[0]["PMIX_NAMESPACE"] + "7"}
    assert master(other, runtime=True, exchange=_no_exchange).port != port
    explicit = master({**ranks[0], "MASTER_ADDR": "h9", "MASTER_PORT": "4444"}, runtime=True)
    assert explicit == Master("h9", 4444, "explicit", "explicit")
    assert master(ranks[0]) == Master(None, None)  # detection alone: still to be found


def test_one_node_hydra_job_without_mpi4py_takes_its_pmi_servers_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hydra exports no launch identity: the port comes from the pid of the process behind
    PMI_FD (the node's PMI proxy), the same for every rank of the node."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    ours, proxy = socket.socketpair()  # the proxy end: this process (the pid SO_PEERCRED gives)
    with ours, proxy:
        env = {**mpi.HYDRA_4[2], "PMI_FD": str(ours.fileno())}
        found = master(env, runtime=True, exchange=_no_exchange)
    port = scheduler_port(f"pmi-server-{os.getpid()}", "mpi")
    assert found == Master("127.0.0.1", port, "local", "local")
    # No socket behind PMI_FD (a pipe, a closed descriptor): nothing to derive; the exchange
    # (absent here) would be asked, and it says mpi4py is missing.
    read, write = os.pipe()
    os.close(write)
    for fd in (str(read), "999999"):
        assert master({**mpi.HYDRA_4[2], "PMI_FD": fd}, runtime=True) == Master(None, None)
    os.close(read)


def test_one_node_mpi_job_with_mpi4py_exchanges_loopback() -> None:
    """Rule 7 on one node (mpi4py imports: node_port answers None): rank 0 sends 127.0.0.1, not
    its host name (which need not resolve: a laptop); on two nodes, its host name."""
    sent: list[tuple[str, int]] = []

    def transport(rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        sent.append(rank0_master())
        return sent[-1]

    for env in (mpi.HYDRA_4[0], mpi.OMPI_4[0]):
        found = find_master(_one_node(env, lambda: None), runtime=True, exchange=transport)
        assert found.addr == "127.0.0.1"
        assert (found.addr_rule, found.port_rule) == ("exchange", "exchange")
    assert master(HYDRA_2_NODES, runtime=True, exchange=transport).addr == socket.gethostname()
    assert master_query(choose("auto", HYDRA_2_NODES)).node_port is None


def test_the_format_never_maps_loopback() -> None:
    """DISTENV_MASTER_ADDR_FORMAT maps host names; a batch script's 127.0.0.1 stays itself (the
    template is still checked)."""
    batch = slurm.SBATCH_BATCH_1T[0]
    assert master({**batch, "DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}).addr == "127.0.0.1"
    with pytest.raises(ConfigurationError, match="expected a template containing"):
        master({**batch, "DISTENV_MASTER_ADDR_FORMAT": "%s-ib"})


def test_exchange_publishes_rank0_host_mapped_and_a_free_port() -> None:
    """Rule 7: rank 0 computes its host name (mapped) and a free port; every rank gets them."""
    sent: list[tuple[str, int]] = []

    def transport(rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        sent.append(rank0_master())  # what rank 0 would broadcast
        return sent[-1]

    env = {**HYDRA_2_NODES, "DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}
    found = master(env, runtime=True, exchange=transport)
    assert found.addr == f"{socket.gethostname()}-ib"
    assert (found.addr_rule, found.port_rule) == ("exchange", "exchange")
    assert sent == [(found.addr, found.port)]
    with_port = master({**HYDRA_2_NODES, "MASTER_PORT": "4711"}, runtime=True, exchange=transport)
    assert (with_port.port, with_port.port_rule) == (4711, "explicit")


def test_master_errors_carry_the_reasons_of_the_choice() -> None:
    """A master rule's error keeps detection's reasons (distenv doctor prints them) and names
    the layer whose variables are at fault (the allocation's scheduler, for MPI ranks)."""
    from distenv import DistEnvError, explain

    with pytest.raises(DistEnvError) as info:
        explain("auto", {**mpi.HYDRA_IN_SALLOC_2N[0], "DISTENV_MASTER_ADDR_FORMAT": "bad"})
    assert info.value.source == "slurm"
    assert ("mpi", "chosen: innermost launcher detected") in info.value.considered


@pytest.mark.parametrize(
    ("env", "extra", "origin"),
    [
        pytest.param(slurm.SRUN_2N_4T[2], {}, "SLURM_STEP_NODELIST", id="srun-step-nodelist"),
        pytest.param(
            slurm.SRUN_2N_4T[2], {"MASTER_ADDR": "n9"}, "MASTER_ADDR", id="srun-master-addr"
        ),
        pytest.param(mpi.HYDRA_IN_SALLOC_2N[1], {}, "SLURM_JOB_NODELIST", id="hydra-allocation"),
        pytest.param(torchrun.TORCHRUN_4[0], {}, "MASTER_ADDR", id="torchrun-stated"),
    ],
)
def test_detection_says_where_the_master_address_came_from(
    env: Mapping[str, str], extra: Mapping[str, str], origin: str
) -> None:
    """locate() reports the variable the master address was read from (errors name it)."""
    from distenv.detection.pipeline import locate

    assert locate("auto", {**env, **extra}, mpi=False).master_from == origin


def test_unresolvable_node_name_names_the_node_list_not_master_addr() -> None:
    """A master host from $SLURM_STEP_NODELIST that does not resolve: the error names that
    variable, says MASTER_ADDR is not set, and gives both fixes."""
    from distenv.bootstrap.store import _resolve
    from distenv.errors import MasterResolutionError

    info = detect_info(slurm.SRUN_2N_4T[2])
    with pytest.raises(MasterResolutionError) as caught:
        _resolve(info, "gvm.invalid", 29500, "SLURM_STEP_NODELIST")
    error = caught.value
    assert str(error).startswith(
        "slurm: rank 2 cannot resolve the master address 'gvm.invalid', which distenv took from "
        "$SLURM_STEP_NODELIST (MASTER_ADDR is not set): "
    )
    assert (error.variable, error.value) == ("SLURM_STEP_NODELIST", "gvm.invalid")
    assert error.hint is not None
    assert "export MASTER_ADDR=" in error.hint
    assert "DISTENV_MASTER_ADDR_FORMAT (--master-addr-format" in error.hint
    with pytest.raises(MasterResolutionError) as given:
        _resolve(info, "gvm.invalid", 29500, "MASTER_ADDR")
    assert "($MASTER_ADDR='gvm.invalid')" in str(given.value)


def detect_info(env: Mapping[str, str]) -> RankInfo:
    """Return the RankInfo detection finds in `env`."""
    from distenv.detection.pipeline import detect

    return detect("auto", env)


def test_an_ascii_master_name_resolves_without_loading_the_idna_codec() -> None:
    """A str host makes CPython load the idna codec (milliseconds, inside every rank's bootstrap):
    an ASCII name is passed as bytes and gives the same addresses. A non-ASCII name still goes
    through idna, and an unresolvable one is still named."""
    import subprocess
    import sys

    from distenv.bootstrap.store import _resolve
    from distenv.errors import MasterResolutionError

    probe = (
        "import socket, sys\n"
        "from distenv.bootstrap.store import _resolve\n"
        "from tests.support.envs import slurm\n"
        "from tests.unit.test_master import detect_info\n"
        "found = _resolve(detect_info(slurm.SRUN_2N_4T[2]), 'localhost', 29500)\n"
        "print('encodings.idna' in sys.modules)\n"
        "print(found == socket.getaddrinfo('localhost', 29500, type=socket.SOCK_STREAM))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "True"]
    with pytest.raises(MasterResolutionError) as caught:
        _resolve(detect_info(slurm.SRUN_2N_4T[2]), "b\u00fccher.invalid", 29500)
    assert "'b\u00fccher.invalid'" in str(caught.value)


def test_resolve_completes_a_one_node_mpi_job_without_mpi4py(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """distenv.resolve (what a script calls after detect) applies the same one-node rule."""
    from distenv import detect, resolve

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    env = mpi.OMPI_4[2]
    info = resolve(detect("auto", env), env=env)
    port = scheduler_port(env["PMIX_NAMESPACE"], "mpi")
    assert (info.master_addr, info.master_port) == ("127.0.0.1", port)
