"""init_dist and setup: what they write, the group they make, and how they fail."""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import warnings

import pytest

with warnings.catch_warnings():
    # torch warns at import when NumPy is missing (the CPU test venv has none).
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

import distenv
from distenv.errors import (
    ConfigurationError,
    DistEnvError,
    InitError,
    RendezvousTimeoutError,
)
from distenv.master import host_port, tcp_url
from distenv.rankinfo import ENV_CONTRACT
from distenv.settings import MAX_SECONDS
from tests.conftest import scrubbed_environ
from tests.support.spawn import (
    REPO,
    clean_process,
    contract_env,
    free_port,
    ipv6_loopback,
    run_workers,
)

CONTRACT = ENV_CONTRACT


@pytest.fixture(autouse=True)
def fresh_process():
    """Give each test a process without a group, distenv state or start method; restore after."""
    with clean_process():
        yield


def set_contract(rank, world_size, port, addr="127.0.0.1"):
    """Put torchrun's contract for one rank into os.environ (restored by the fixture)."""
    os.environ.pop("DISTENV_SCOPE", None)  # a fresh launch, not distenv's earlier export
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
    )


@pytest.mark.parametrize(
    ("host", "port", "address", "url"),
    [
        pytest.param("node01", 29500, "node01:29500", "tcp://node01:29500", id="name"),
        pytest.param("10.0.0.7", 1, "10.0.0.7:1", "tcp://10.0.0.7:1", id="ipv4"),
        pytest.param("::1", 29500, "[::1]:29500", "tcp://[::1]:29500", id="ipv6"),
        pytest.param(
            "fe80::1%eth0", 80, "[fe80::1%eth0]:80", "tcp://[fe80::1%eth0]:80", id="ipv6-scope"
        ),
    ],
)
def test_host_port_and_url(host, port, address, url):
    """IPv6 addresses are bracketed wherever distenv writes host:port or a tcp:// URL."""
    assert host_port(host, port) == address
    assert tcp_url(host, port) == url


def test_alone_makes_one_rank_group(caplog):
    """Without a launcher: a 1-rank gloo group on 127.0.0.1, the contract exported, one log line."""
    caplog.set_level(logging.INFO, logger="distenv")
    info = distenv.init_dist()
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == (
        "none",
        0,
        1,
        "127.0.0.1",
    )
    assert dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    assert {name: os.environ[name] for name in CONTRACT} == info.to_env()
    assert os.environ["DISTENV_SCOPE"] == "none/-/-"
    assert multiprocessing.get_start_method(allow_none=True) == "spawn"
    assert [r.getMessage() for r in caplog.records if r.name == "distenv"] == [
        f"init_dist: launcher=none world_size=1 nodes=1 master=127.0.0.1:{info.master_port} "
        "backend=gloo device=cpu"
    ]


def test_second_call_returns_same_info():
    """A second init_dist for the same world returns the same RankInfo and keeps the group."""
    first = distenv.init_dist()
    world = dist.group.WORLD
    port = os.environ["MASTER_PORT"]
    second = distenv.init_dist()
    assert second is first
    assert dist.group.WORLD is world
    assert os.environ["MASTER_PORT"] == port


def test_initialised_for_another_world_raises():
    """A group made for 1 rank, then a launcher saying rank 1 of 2: InitError naming both."""
    distenv.init_dist()
    set_contract(1, 2, free_port())
    with pytest.raises(InitError) as caught:
        distenv.init_dist("pytorch")
    assert str(caught.value).startswith(
        "pytorch: torch.distributed is already initialised as rank 0 of 1, but the launcher "
        "says rank 1 of 2. Hint: call init_dist once"
    )


def test_a_second_call_with_another_backend_raises():
    """A gloo group, then init_dist(backend="mpi"): ConfigurationError naming both; the same
    backend again, in any case, returns the same RankInfo (#43 item 4)."""
    first = distenv.init_dist()
    assert distenv.init_dist(backend=" GLOO ") is first
    with pytest.raises(ConfigurationError) as caught:
        distenv.init_dist(backend="mpi")
    assert (caught.value.variable, caught.value.value) == ("backend", "mpi")
    assert str(caught.value) == (
        "none: torch.distributed is already initialised with backend 'gloo', but init_dist was "
        "now asked for backend='mpi'. Hint: call init_dist once, with backend='mpi' (or call "
        "torch.distributed.destroy_process_group() first)"
    )


def test_group_made_elsewhere_for_same_world_is_kept():
    """A 1-rank group someone else made is accepted as is: no second group, no error."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    world = dist.group.WORLD
    info = distenv.init_dist()
    assert (info.rank, info.world_size) == (0, 1)
    assert dist.group.WORLD is world


def test_setup_exports_without_group():
    """setup() exports the contract and the scope tag, sets spawn, and creates no group."""
    info = distenv.setup()
    assert not dist.is_initialized()
    assert {name: os.environ[name] for name in CONTRACT} == info.to_env()
    assert os.environ["DISTENV_SCOPE"] == "none/-/-"
    assert multiprocessing.get_start_method(allow_none=True) == "spawn"
    assert distenv.init_dist() is info  # the group then uses the port setup exported


def test_setup_leaves_a_layout_the_roll_call_fills_unexported():
    """A Flux task of a 2 x 2 job: setup() exports no LOCAL_WORLD_SIZE or GROUP_RANK (a stale
    one is removed), only init_dist's roll call counts them."""
    from tests.support.envs import flux

    os.environ.update(flux.FLUX_2X2[2], MASTER_ADDR="127.0.0.1", LOCAL_WORLD_SIZE="8")
    info = distenv.setup()
    assert (info.local_rank, info.local_world_size, info.node_rank) == (0, None, None)
    assert os.environ["LOCAL_RANK"] == "0"
    assert "LOCAL_WORLD_SIZE" not in os.environ
    assert "GROUP_RANK" not in os.environ
    assert os.environ["GROUP_WORLD_SIZE"] == "2"


def test_start_method_set_elsewhere_is_kept():
    """An explicit start method chosen by the program survives init_dist."""
    multiprocessing.set_start_method("forkserver")
    distenv.setup()
    assert multiprocessing.get_start_method() == "forkserver"


def test_start_method_none_leaves_it_unset():
    """start_method=None does not set a start method."""
    distenv.setup(start_method=None)
    assert multiprocessing.get_start_method(allow_none=True) is None


def test_seed_seeds_after_init():
    """init_dist(seed=s) leaves torch's generator exactly as torch.manual_seed(s) does."""
    distenv.init_dist(seed=11)
    drawn = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(drawn, torch.rand(4))


# torch warns about NCCL's default timeout on its way to the error this test is about.
@pytest.mark.filterwarnings("ignore:Attempted to get default timeout for nccl:UserWarning")
def test_explicit_backend_failure_is_init_error():
    """A backend torch cannot provide (nccl on CPU-only torch) is an InitError naming it."""
    if torch.cuda.is_available():
        pytest.skip("nccl is available here")
    with pytest.raises(InitError, match=r"init_process_group\(backend='nccl'\) failed"):
        distenv.init_dist(backend="nccl")
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"timeout": 0}, r"timeout=0 is invalid", id="timeout-zero"),
        pytest.param({"timeout": "60"}, r"timeout='60' is invalid", id="timeout-str"),
        pytest.param({"timeout": True}, r"timeout=True is invalid", id="timeout-bool"),
        pytest.param(
            {"rendezvous_timeout": datetime.timedelta(seconds=-1)},
            r"rendezvous_timeout=datetime.timedelta\(days=-1",
            id="rendezvous-negative",
        ),
        pytest.param(
            {"rendezvous_timeout": float("inf")}, r"rendezvous_timeout=inf", id="rendezvous-inf"
        ),
        pytest.param({"start_method": "fork2"}, r"start_method='fork2'", id="start-method"),
        pytest.param({"seed": -1}, r"seed=-1 is not an integer", id="seed"),
        pytest.param({"backend": " "}, r"backend=' ' is empty", id="backend-empty"),
    ],
)
def test_bad_arguments_change_nothing(kwargs, match):
    """Invalid arguments raise ConfigurationError before anything is exported or created."""
    with pytest.raises(ConfigurationError, match=match):
        distenv.init_dist(**kwargs)
    assert "RANK" not in os.environ
    assert not dist.is_initialized()
    assert multiprocessing.get_start_method(allow_none=True) is None


def test_bad_distenv_timeout_names_variable():
    """A malformed $DISTENV_TIMEOUT is a ConfigurationError naming the variable and its text."""
    os.environ["DISTENV_TIMEOUT"] = "5m"
    with pytest.raises(ConfigurationError) as caught:
        distenv.init_dist()
    assert (caught.value.variable, caught.value.value) == ("DISTENV_TIMEOUT", "5m")
    assert str(caught.value).startswith("init: $DISTENV_TIMEOUT is '5m', expected a positive")


@pytest.mark.parametrize("via_env", [False, True], ids=["argument", "DISTENV_TIMEOUT"])
def test_unreachable_master_times_out(via_env):
    """Rank 1 with nobody at MASTER_PORT fails within the rendezvous timeout, naming host:port."""
    port = free_port()
    set_contract(1, 2, port)
    kwargs = {}
    if via_env:
        os.environ["DISTENV_TIMEOUT"] = "1"
    else:
        kwargs["rendezvous_timeout"] = datetime.timedelta(seconds=1)
    start = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as caught:
        distenv.init_dist(**kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < 1 + 3
    assert f"could not reach rank 0's store at 127.0.0.1:{port} within 1 s" in str(caught.value)
    assert not dist.is_initialized()


def test_port_in_use_names_port():
    """Rank 0 whose MASTER_PORT is taken raises DistEnvError naming the port and MASTER_PORT."""
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        set_contract(0, 1, port)
        with pytest.raises(DistEnvError) as caught:
            distenv.init_dist(rendezvous_timeout=5)
    assert caught.value.variable == "MASTER_PORT"
    assert str(caught.value).startswith(
        f"pytorch: rank 0 cannot listen on port {port} ($MASTER_PORT={port}) for the store: "
        "the port is already in use. Hint:"
    )


# IPv6 loopback where the machine has one: every multi-rank test elsewhere uses 127.0.0.1, so this
# one covers the store, the client's connect probe and the log line with a bracketed address.
CONTRACT_ADDR = "::1" if ipv6_loopback() else "127.0.0.1"


@pytest.fixture(scope="module")
def contract_results():
    """Run the init scenario once on 2 ranks started under torchrun's contract.

    At the longest rendezvous timeout accepted (a year): it reaches every layer below intact
    (#44 item 9; 1e10 s broke torch's store client, 1e13 s gloo).
    """
    port = free_port(CONTRACT_ADDR)
    extra = {"TORCHELASTIC_RUN_ID": "job7", "DISTENV_TIMEOUT": f"{MAX_SECONDS:.0f}"}
    envs = [contract_env(rank, 2, port, addr=CONTRACT_ADDR, extra=extra) for rank in range(2)]
    return run_workers("init", envs)


def test_contract_ranks_and_exports(contract_results):
    """Under the contract each rank gets its RankInfo, exports it, and the group works (sum 1+2)."""
    for rank, result in enumerate(contract_results):
        info = result["info"]
        assert (info["launcher"], info["rank"], info["world_size"]) == ("pytorch", rank, 2)
        assert info["master_addr"] == CONTRACT_ADDR
        assert (info["local_rank"], info["job_id"]) == (rank, "job7")
        assert result["before"] == [0, 1]
        assert result["after"] == [rank, 2]
        assert result["backend"] == "gloo"
        assert result["sum"] == 3.0
        assert result["env"]["RANK"] == str(rank)
        assert result["env"]["DISTENV_SCOPE"] == "pytorch/job7/-"
        assert result["start_method"] == "spawn"


def test_contract_second_call_and_log(contract_results):
    """Calling init_dist again on a rank is a no-op; only rank 0 logs the summary line."""
    assert all(r["same_info"] and r["same_group"] for r in contract_results)
    port = contract_results[0]["info"]["master_port"]
    assert contract_results[0]["log"] == [
        f"init_dist: launcher=pytorch world_size=2 nodes=1 master={host_port(CONTRACT_ADDR, port)} "
        "backend=gloo device=cpu"
    ]
    assert contract_results[1]["log"] == []


def test_contract_seed_is_shared(contract_results):
    """init_dist(seed=7) gives every rank the same torch stream, the one manual_seed(7) gives."""
    torch.manual_seed(7)
    expected = torch.rand(3).tolist()
    assert [r["rand"] for r in contract_results] == [expected, expected]


def run_example(args, timeout=120):
    """Run a command for examples/train.py with a scrubbed environment; return (rc, out, err)."""
    env = scrubbed_environ()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_example_alone():
    """examples/train.py with no launcher trains as 1 rank and prints one summary line."""
    rc, out, err = run_example([sys.executable, "examples/train.py", "--steps", "5"])
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("train: launcher=none world_size=1 steps=5 loss=")
    assert lines[0].endswith(" weights_identical=True")


def test_example_under_torchrun():
    """torchrun --nproc-per-node 2 examples/train.py: the agent's store, identical weights."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    rc, out, err = run_example([*torchrun, "examples/train.py", "--steps", "5"])
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("train:")]
    assert len(lines) == 1
    assert lines[0].startswith("train: launcher=pytorch world_size=2 steps=5 loss=")
    assert lines[0].endswith(" weights_identical=True")


@pytest.mark.parametrize("timeout", [123, None])
def test_collectives_get_the_users_timeout_after_the_bounded_connect(timeout):
    """init_process_group connects with the bootstrap's time left, then gets timeout= back.

    torch's private _set_pg_timeout (since 2.1) restores it; if a torch lacks it, the group keeps
    the user's timeout from the start (distenv.bootstrap.group). Either way collectives wait `timeout`.
    """
    import datetime

    import torch
    import torch.distributed as dist

    from distenv.bootstrap.group import torch_timeout

    assert hasattr(dist.distributed_c10d, "_set_pg_timeout"), "torch dropped _set_pg_timeout"
    distenv.init_dist("none", timeout=timeout, rendezvous_timeout=7)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    expected = dist.default_pg_timeout if timeout is None else datetime.timedelta(seconds=timeout)
    assert backend.options._timeout == expected
    assert torch_timeout(timeout) == expected
