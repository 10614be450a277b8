"""init_dist on CUDA: device before group, device_id, NCCL, collectives on the GPU.

Marked ``gpu``: CI deselects them (``-m "not gpu"``); run them on a GPU machine.
"""

from __future__ import annotations

import re
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing
    import torch
    import torch.distributed as dist

import distenv
import distenv.state
from distenv.device import device_identity
from tests.support.spawn import clean_process, contract_env, free_port, run_workers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def fresh_process():
    """Give each test a process without a group, distenv state or start method; restore after."""
    with clean_process():
        yield


def test_device_set_before_group_and_passed(monkeypatch):
    """set_device(0) happens before init_process_group, which gets device_id=cuda:0 and nccl."""
    calls = []
    set_device, init_process_group = torch.cuda.set_device, dist.init_process_group

    def recording_set_device(device):
        calls.append(("set_device", device))
        set_device(device)

    def recording_init(*args, **kwargs):
        calls.append(("init_process_group", kwargs.get("backend"), kwargs.get("device_id")))
        init_process_group(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "set_device", recording_set_device)
    monkeypatch.setattr(dist, "init_process_group", recording_init)
    distenv.init_dist()
    # torch may set the device again inside; what matters is that distenv's call comes first.
    assert calls[0] == ("set_device", 0)
    assert ("init_process_group", "nccl", torch.device("cuda", 0)) in calls[1:]
    assert torch.cuda.current_device() == 0
    assert dist.get_backend() == "nccl"


def test_eager_nccl_skips_the_group_up_round_trip(monkeypatch):
    """NCCL given device_id= creates its communicator in init, collectively: the group-up round
    trip is skipped and rank 0 only releases the group (distenv.bootstrap.proof); the group works."""
    import distenv.bootstrap.group as group

    taken = []
    release, group_up = group.release_group, group.group_up

    def recording_release(*args, **kwargs):
        taken.append("release")
        return release(*args, **kwargs)

    def recording_group_up(*args, **kwargs):
        taken.append("group_up")
        return group_up(*args, **kwargs)

    monkeypatch.setattr(group, "release_group", recording_release)
    monkeypatch.setattr(group, "group_up", recording_group_up)
    distenv.init_dist()
    assert dist.get_backend() == "nccl"
    assert taken == ["release"]
    tensor = torch.ones(2, device="cuda")
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0]


def test_all_reduce_on_cuda():
    """A 1-rank NCCL group reduces a CUDA tensor; allreduce helpers accept CUDA tensors."""
    distenv.init_dist()
    tensor = torch.arange(4.0, device="cuda")
    dist.all_reduce(tensor)
    distenv.allreduce_params([tensor])
    assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert tensor.device == torch.device("cuda", 0)


def test_per_device_backend():
    """backend='cpu:gloo,cuda:nccl' is passed through and serves CPU and CUDA tensors."""
    distenv.init_dist(backend="cpu:gloo,cuda:nccl")
    cpu, gpu = torch.ones(2), torch.ones(2, device="cuda")
    dist.all_reduce(cpu)
    dist.all_reduce(gpu)
    assert cpu.tolist() == gpu.tolist() == [1.0, 1.0]


def test_set_device_false_leaves_device():
    """set_device=False calls no set_device and passes no device_id (nccl is still chosen)."""
    distenv.init_dist(set_device=False)
    assert dist.get_backend() == "nccl"
    assert distenv.state.current_device() == 0


def test_device_identity_is_stable():
    """device_identity names the physical GPU: a UUID or a PCI address, the same on every call."""
    identity = device_identity(0)
    assert re.fullmatch(r"(GPU|MIG)-[0-9a-fA-F-]+|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}", identity)
    assert device_identity(0) == identity


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_ranks_nccl():
    """Two ranks under the contract pick cuda:0 and cuda:1, choose nccl, and reduce on the GPU."""
    port = free_port()
    results = run_workers("gpu", [contract_env(rank, 2, port) for rank in range(2)])
    assert [r["device"] for r in results] == [0, 1]
    assert [r["backend"] for r in results] == ["nccl", "nccl"]
    assert [r["sum"] for r in results] == [3.0, 3.0]


def test_nccl_group_keeps_device_and_users_timeout():
    """The group is created in distenv's bootstrap thread: the main thread keeps its device, the
    NCCL communicator is bound to it, and collectives get timeout= after the bounded connect."""
    import datetime

    from distenv.bootstrap.records import matches

    distenv.init_dist(timeout=321)
    assert torch.cuda.current_device() == 0
    assert dist.get_backend() == "nccl"
    backend = dist.group.WORLD._get_backend(torch.device("cuda", 0))
    assert backend.options._timeout == datetime.timedelta(seconds=321)
    tensor = torch.ones(3, device="cuda")
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    # What the roll call reports for this GPU passes the record schema on every rank.
    assert matches("device", device_identity(0))


def test_distenv_run_on_one_gpu_picks_nccl():
    """`distenv run -n 1` on a GPU machine: cuda:0, nccl, a reduction on the GPU."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import scrubbed_environ
    from tests.support.spawn import REPO, WORKERS

    env = {**scrubbed_environ(), "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])}
    done = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "1", str(WORKERS), "gpu"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    assert (result["device"], result["backend"], result["sum"]) == (0, "nccl", 1.0)


NCCL_RANK = """
import torch, torch.distributed as dist, distenv
distenv.init_dist(launcher="none")
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("sum", int(t.item()), flush=True)
"""


def test_nccl_uses_the_interface_distenv_exports_in_its_syntax():
    """What `distenv.system.netpath.export` writes for NCCL (``=lo``: NCCL's exact-match form) is the
    interface NCCL then reports using (NCCL_DEBUG=INFO names it): the syntax distenv moves a node's
    NCCL with is one NCCL accepts, not only one gloo does."""
    import os
    import subprocess
    import sys

    from distenv.system.netpath import export
    from tests.conftest import scrubbed_environ

    name, value = export("nccl", "lo")
    env = {**scrubbed_environ(), name: value, "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}
    env.pop("NCCL_COMM_ID", None)
    done = subprocess.run(
        [sys.executable, "-c", NCCL_RANK], env=env, capture_output=True, text=True, timeout=120,
        cwd=os.getcwd(), check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "sum 1" in out
    assert name == "NCCL_SOCKET_IFNAME"
    assert value == "=lo"
    used = re.findall(r"(?:Bootstrap|NET/Socket) ?: Using \[?\d*\]?(\w+):", out)
    assert used, out
    assert set(used) == {"lo"}, out


SHARED_RANK = """
import sys, torch, torch.distributed as dist, distenv
sharing = sys.argv[1] == "share"
info = distenv.init_dist(allow_gpu_sharing=sharing, backend="gloo" if sharing else None)
t = torch.ones(1)
dist.all_reduce(t)
# One write per line: the two ranks share the launcher's stdout.
sys.stdout.write(f"rank {info.rank} cuda {torch.cuda.current_device()} sum {int(t.item())}\\n")
"""


def _distenv_run(tmp_path, ranks, *args, visible="0"):
    """Run SHARED_RANK under `distenv run -n RANKS` with one GPU visible; return it and its time."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import scrubbed_environ
    from tests.support.spawn import REPO

    script = tmp_path / "shared_rank.py"
    script.write_text(SHARED_RANK)
    env = {
        **scrubbed_environ(),
        "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]]),
        "CUDA_VISIBLE_DEVICES": visible,
        "DISTENV_TIMEOUT": "60",
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", str(ranks), str(script), *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done, time.monotonic() - start


def test_two_ranks_on_one_gpu_are_refused_by_the_roll_call_before_nccl(tmp_path):
    """Two ranks where one GPU is visible both land on cuda:0 (local rank 1 wraps): the roll call
    compares the GPUs' identities and refuses on every rank, naming the ranks, the GPU and the
    fix, well inside the timeout, before NCCL could fail its own way ("Duplicate GPU")."""
    done, seconds = _distenv_run(tmp_path, 2, "alone")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    identity = device_identity(0)
    assert "drive the same GPU" in out, out
    assert f"({identity})" in out, out
    assert "allow_gpu_sharing=True" in out, out
    assert "Duplicate GPU" not in out, out
    assert "sum" not in done.stdout, out
    assert seconds < 45, (seconds, out)


def test_gpu_sharing_allowed_runs_both_ranks_on_the_one_gpu(tmp_path):
    """allow_gpu_sharing=True lets two ranks share the one visible GPU (gloo for the group)."""
    done, _ = _distenv_run(tmp_path, 2, "share")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 cuda 0 sum 2", "rank 1 cuda 0 sum 2"], out


def test_device_identity_is_the_same_gpu_under_its_uuid_in_cuda_visible_devices(tmp_path):
    """A GPU named by its UUID in CUDA_VISIBLE_DEVICES (as Slurm's and Kubernetes' device plugins
    may) has the identity it has under its index: the identity is the physical GPU's."""
    import subprocess
    import sys

    from tests.conftest import scrubbed_environ

    identity = device_identity(0)
    code = "from distenv.device import device_identity; print(device_identity(0))"
    env = {**scrubbed_environ(), "CUDA_VISIBLE_DEVICES": identity}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == identity


def test_the_readme_training_script_runs_on_the_gpu():
    """examples/train.py, the README's main job, unchanged under `distenv run -n 1` on a GPU:
    nccl, DDP on cuda:0, and its own end-of-run check that the weights agree."""
    import os
    import subprocess
    import sys

    from tests.conftest import scrubbed_environ
    from tests.support.spawn import REPO

    env = {**scrubbed_environ(), "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])}
    done = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "1", "examples/train.py", "--steps", "5"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "world_size=1 steps=5" in done.stdout, out
    assert "weights_identical=True" in done.stdout, out
