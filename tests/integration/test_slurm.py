"""srun steps on the real test clusters: every rank's RankInfo and a finished all_reduce.

Clusters (tests/harness/setup.sh): `one` is this machine as one node with 8 CPUs and 4 fake GPUs;
`multi` is nodes n1..n4 with their own host names, 4 CPUs and 2 fake GPUs each. Launches that do
not compete for the same GPUs run concurrently: 2 cores make that the only way to stay fast.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from distenv.errors import ConfigurationError
from distenv.visibility import check_rocm_indices
from tests.support.integration.faults import survivors
from tests.support.integration.helpers import (
    FOUR_NODES,
    JOB_NAME,
    ONE_NODE,
    PYTHON,
    SINGLE,
    STEPS,
    TWO_BY_TWO,
    Harness,
    Result,
    check_world,
    rank_check,
    wait_all,
)
from tests.support.integration.recipes import (
    HF_OFFLINE,
    HF_TRAINER_PARTS,
    HF_TRAINER_REPORT,
    HF_TRAINER_STEPS,
    check,
    launch,
    script,
)

pytestmark = pytest.mark.slurm

SRUN = ["srun", "-J", JOB_NAME]


def test_srun_on_one_node(harness: Harness) -> None:
    """`srun -n 4` on one node: ranks 0-3, local ranks 0-3, master is the node, auto == slurm."""
    auto, named = wait_all(
        [
            harness.start([*SRUN, "-n", "4", *rank_check()], cluster="one"),
            harness.start([*SRUN, "-n", "4", *rank_check("--launcher", "slurm")], cluster="one"),
        ]
    )
    host = socket.gethostname()
    for result in (auto, named):
        check_world(result, launcher="slurm", layouts=ONE_NODE, master=host, hosts=[host] * 4)


def test_srun_on_several_nodes(harness: Harness) -> None:
    """`srun -N 2 --ntasks-per-node 2` and `srun -N 4 -n 4`: node ranks follow the hosts."""
    launches = [
        harness.start(
            [*SRUN, "-N", "2", "--ntasks-per-node", "2", *rank_check(*args)], cluster="multi"
        )
        for args in ((), ("--launcher", "slurm"))
    ] + [
        harness.start([*SRUN, "-N", "4", "-n", "4", *rank_check(*args)], cluster="multi")
        for args in ((), ("--launcher", "slurm"))
    ]
    two_auto, two_named, four_auto, four_named = wait_all(launches)
    for result in (two_auto, two_named):
        recs = check_world(result, launcher="slurm", layouts=TWO_BY_TWO)
        hosts = [r["hostname"] for r in recs]
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    for result in (four_auto, four_named):
        recs = check_world(result, launcher="slurm", layouts=FOUR_NODES)
        assert len({r["hostname"] for r in recs}) == 4


def test_step_on_a_subset_of_the_allocation(harness: Harness) -> None:
    """`srun -N 2 -r 2 -n 4` inside `salloc -N 4`: ranks on n3/n4, master is n3 (not the job's n1).

    Both steps (auto, then --launcher slurm) run inside one allocation, through steps.py.
    """
    step = ["srun", "-N", "2", "-r", "2", "-n", "4"]
    result = harness.run(
        ["salloc", "-J", JOB_NAME, "-N", "4", "--exclusive", PYTHON, STEPS,
         *step, *rank_check(), ":::", *step, *rank_check("--launcher", "slurm")],
        cluster="multi",
    ).ok()  # fmt: skip
    steps = result.steps()
    assert len(steps) == 2, result.text
    for s in steps:
        check_world(s, launcher="slurm", layouts=TWO_BY_TWO, master="n3",
                    hosts=["n3", "n3", "n4", "n4"])  # fmt: skip


def test_batch_script_and_salloc_shell_are_not_ranks(harness: Harness) -> None:
    """The batch step / salloc shell of a 4-task job is refused with the srun hint; of 1 task: 0/1.

    Without the refusal the process would be "rank 0 of 4" and wait forever for three ranks.
    """
    direct = " ".join(["exec", *rank_check()])  # paths only: no value of the environment
    batch4, batch1 = (
        harness.sbatch(None, cluster="one", options=["-n", n, "--wrap", direct], label=f"batch{n}")
        for n in ("4", "1")
    )
    salloc4, salloc1 = (
        harness.start(["salloc", "-J", JOB_NAME, "-n", n, *rank_check()], cluster="one")
        for n in ("4", "1")
    )
    b4, b1, s4, s1 = wait_all([batch4, batch1, salloc4, salloc1])
    for refused in (b4, s4):
        assert refused.returncode == 1, refused.text
        message = refused.stderr + "".join(
            body for name, body in refused.files.items() if name.endswith(".err")
        )
        assert "rank_check: slurm: " in message, refused.text
        assert "rank 0 of 4" in message, refused.text
        assert "Hint: start one task per GPU with `srun" in message, refused.text
        assert not refused.records(), refused.text
    for single in (b1, s1):
        check_world(single, launcher="slurm", layouts=SINGLE, master="127.0.0.1")


def test_fake_gpus_bind_one_device_per_task_or_local_rank(harness: Harness) -> None:
    """Per-task GPUs: each task sees one device and uses index 0; per-node: index == local rank.

    The device index is `distenv.device.select_device` with the number of CUDA_VISIBLE_DEVICES
    entries as the visible count (there is no real GPU); init_dist falls back to gloo. Slurm
    (gres.conf without Flags=) writes the same global index into ROCR_VISIBLE_DEVICES and
    ZE_AFFINITY_MASK: on a ROCm build every task but GPU 0's would see no GPU through HIP, and
    is refused (`distenv.visibility.check_rocm_indices`).
    """
    per_task, per_node, multi_per_task = wait_all(
        [
            harness.start([*SRUN, "-n", "4", "--gpus-per-task=1", *rank_check()], cluster="one"),
            harness.start(
                [*SRUN, "-n", "4", "--gpus-per-node=4", *rank_check("--launcher", "slurm")],
                cluster="one",
            ),
            harness.start(
                [*SRUN, "-N", "2", "--ntasks-per-node", "2", "--gpus-per-task=1", *rank_check()],
                cluster="multi",
            ),
        ]
    )
    recs = check_world(per_task, launcher="slurm", layouts=ONE_NODE)
    # Fake GPUs keep their global index (no cgroup renumbering): one distinct device per task.
    assert sorted(r["cuda_visible_devices"] for r in recs) == ["0", "1", "2", "3"], recs
    assert [r["device"] for r in recs] == [0, 0, 0, 0]
    for r in recs:
        env = {k: v for k, v in r["env"].items() if v is not None}
        assert env["ROCR_VISIBLE_DEVICES"] == env["ZE_AFFINITY_MASK"] == r["cuda_visible_devices"]
        env["CUDA_VISIBLE_DEVICES"] = r["cuda_visible_devices"]
        check_rocm_indices("cuda", env)  # a CUDA build reads none of it
        if r["cuda_visible_devices"] == "0":
            check_rocm_indices("rocm", env)
        else:
            with pytest.raises(ConfigurationError, match="Flags=amd_gpu_env"):
                check_rocm_indices("rocm", env)
    recs = check_world(per_node, launcher="slurm", layouts=ONE_NODE)
    assert {r["cuda_visible_devices"] for r in recs} == {"0,1,2,3"}
    assert [r["device"] for r in recs] == [0, 1, 2, 3]
    recs = check_world(multi_per_task, launcher="slurm", layouts=TWO_BY_TWO)
    assert [len(r["cuda_visible_devices"].split(",")) for r in recs] == [1, 1, 1, 1], recs
    for node in (recs[:2], recs[2:]):
        assert sorted(r["cuda_visible_devices"] for r in node) == ["0", "1"], recs
    assert [r["device"] for r in recs] == [0, 0, 0, 0]


# Left in the environment by an earlier job or a shell profile (issue #13): what srun passes on.
STALE_TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29599",
}
STALE_OMPI = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "PMIX_RANK": "0",
}
# What `distenv export` printed in task 1 of an earlier `srun -n 2`, less its DISTENV_SCOPE (0.1.0
# printed none), with that job's master now gone (TEST-NET-1: never routed).
STALE_EXPORT = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "192.0.2.1",
    "MASTER_PORT": "29598",
}
BOUND = {"DISTENV_TIMEOUT": "10"}  # should the refusal regress, no rank waits long
INIT_ONLY = [PYTHON, "-c", "import distenv; distenv.init_dist()"]
# 0.1.0 waited 22 s for rank 0's store, then blamed the network. The bound is one torch import
# (init_dist imports torch.distributed first) with three launches on 2 cores: 7 s measured.
REFUSAL_S = 20.0


def test_stale_launcher_variables_are_refused_on_every_task(harness: Harness) -> None:
    """Exported RANK/WORLD_SIZE/MASTER_* or an outer mpirun's OMPI_* in `srun -n 2`: every task
    exits 1 at once with a message naming both sets; `srun -n 1 distenv run -n 2` still works.
    A stale `distenv export` without DISTENV_SCOPE that matches task 1 is refused on task 1 too,
    and no process of that launch survives (issue #25: task 1 went to the old job's master and
    waited its whole timeout)."""
    tag = f"stale-export-{uuid.uuid4().hex[:8]}"  # in every task's argv, to find survivors
    torch_vars, ompi_vars, local, matching = wait_all(
        [
            harness.start(
                [*SRUN, "-n", "2", *INIT_ONLY],
                env=harness.env("one", extra={**STALE_TORCHRUN, **BOUND}),
                cluster="one",
            ),
            harness.start(
                [*SRUN, "-n", "2", *INIT_ONLY], env=harness.env("one", extra={**STALE_OMPI, **BOUND}),
                cluster="one",
            ),
            harness.start(
                [*SRUN, "-n", "1", PYTHON, "-m", "distenv", "run", "-n", "2", *rank_check()[1:]],
                cluster="one",
            ),
            harness.start(
                [*SRUN, "-n", "2", *INIT_ONLY, tag],
                env=harness.env("one", extra={**STALE_EXPORT, **BOUND}), cluster="one",
            ),
        ]
    )  # fmt: skip
    for result, head in (
        (
            torch_vars,
            "pytorch: RANK=3 WORLD_SIZE=4 contradict slurm, which started this process as",
        ),
        (ompi_vars, "mpi: OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 contradict slurm, which"),
    ):
        assert result.returncode == 1, result.text
        assert result.seconds < REFUSAL_S, result.text
        refusals = [line for line in result.stderr.splitlines() if head in line]
        assert len(refusals) == 2, result.text
        for task in range(2):
            assert sum(f"SLURM_PROCID={task} SLURM_STEP_NUM_TASKS=2" in r for r in refusals) == 1
    assert "exported by an earlier job or a shell profile" in torch_vars.stderr
    assert "inherited from an outer mpirun or mpiexec" in ompi_vars.stderr
    assert "different MPI library" not in ompi_vars.stderr
    layouts = [(r, 2, r, 2, 0, 1) for r in range(2)]
    check_world(local, launcher="pytorch", layouts=layouts, master="127.0.0.1")
    assert matching.returncode == 1, matching.text
    assert matching.seconds < REFUSAL_S, matching.text
    for task, verb in ((0, "contradict"), (1, "match")):
        head = (
            f"pytorch: RANK=1 WORLD_SIZE=2 {verb} slurm, which started this process as "
            f"SLURM_PROCID={task} SLURM_STEP_NUM_TASKS=2, and were not set by any launcher "
            "inside the step"
        )
        assert sum(head in line for line in matching.stderr.splitlines()) == 1, matching.text
    assert "(or pass --launcher pytorch if a wrapper inside the step sets them" in matching.stderr
    assert survivors(tag) == []


def test_unresolvable_node_name_names_the_node_list_and_both_fixes(harness: Harness) -> None:
    """A master host taken from the step's node list that does not resolve (a NodeName that is
    not a host name; here made so by DISTENV_MASTER_ADDR_FORMAT): every task fails at once naming
    $SLURM_STEP_NODELIST, not a MASTER_ADDR the user never set, and gives both fixes."""
    env = harness.env("one", extra={"DISTENV_MASTER_ADDR_FORMAT": "{host}.invalid", **BOUND})
    result = harness.run([*SRUN, "-n", "2", *INIT_ONLY], env=env, cluster="one")
    assert result.returncode == 1, result.text
    assert result.seconds < REFUSAL_S, result.text
    host = f"{socket.gethostname()}.invalid"
    errors = [line for line in result.stderr.splitlines() if "cannot resolve" in line]
    assert len(errors) == 2, result.text
    for line in errors:
        assert (
            f"cannot resolve the master address {host!r}, which distenv took from "
            "$SLURM_STEP_NODELIST (MASTER_ADDR is not set)"
        ) in line, line
        assert "export MASTER_ADDR=" in line, line
        assert "--master-addr-format" in line, line
        assert "($MASTER_ADDR=" not in line


# A heterogeneous job whose component 0 (1 task) has the later host name, component 1 3 tasks.
ONE_PLUS_THREE = [(0, 4, 0, 1, 0, 2), (1, 4, 0, 3, 1, 2), (2, 4, 1, 3, 1, 2), (3, 4, 2, 3, 1, 2)]
HET_STEP = ["srun", "--het-group=0,1"]


def test_heterogeneous_job_steps_in_both_placements(harness: Harness) -> None:
    """`srun --het-group=0,1` in `salloc -w n3 -n2 : -w n4 -n2` (components in host-name order)
    and in `salloc -w n2 -n1 : -w n1 -n3` (rank 0 on the later host name, while the step's node
    list is n[1-2] and its tasks per node 3,1), a step that runs component 0 on only the second of
    its nodes (`srun -w n4 -N1 -n1 : -w n1 -n1` in `salloc -w n3,n4 -N2 -n2 : -w n1 -n1`: rank 0
    on n4, while the step list is n[1,4]), plus a het job srun makes itself (`srun -w n4 -n1 : -w
    n3 -n1`, only the PACK spelling of the component lists): every rank's layout, master = the
    first host of component 0 in the step, one scope for all components (the leader's
    SLURM_JOB_ID)."""
    salloc = ["salloc", "-J", JOB_NAME]
    normal, reversed_, partial, direct = wait_all(
        [
            harness.start([*salloc, "-w", "n3", "-n", "2", ":", "-w", "n4", "-n", "2",
                           *HET_STEP, *rank_check()], cluster="multi"),
            harness.start([*salloc, "-w", "n2", "-n", "1", ":", "-w", "n1", "-n", "3",
                           *HET_STEP, *rank_check("--launcher", "slurm")], cluster="multi"),
            harness.start([*salloc, "-w", "n3,n4", "-N", "2", "-n", "2", ":", "-w", "n1", "-n",
                           "1", "srun", "-w", "n4", "-N", "1", "-n", "1", ":", "-w", "n1", "-n",
                           "1", *rank_check()], cluster="multi"),
            harness.start([*SRUN, "-w", "n4", "-n", "1", ":", "-w", "n3", "-n", "1",
                           *rank_check()], cluster="multi"),
        ]
    )  # fmt: skip
    worlds = (
        (normal, TWO_BY_TWO, "n3", ["n3", "n3", "n4", "n4"]),
        (reversed_, ONE_PLUS_THREE, "n2", ["n2", "n1", "n1", "n1"]),
        (partial, [(0, 2, 0, 1, 0, 2), (1, 2, 0, 1, 1, 2)], "n4", ["n4", "n1"]),
        (direct, [(0, 2, 0, 1, 0, 2), (1, 2, 0, 1, 1, 2)], "n4", ["n4", "n3"]),
    )
    for result, layouts, master, hosts in worlds:
        recs = check_world(result, launcher="slurm", layouts=layouts, master=master, hosts=hosts)
        job = recs[0]["info"]["job_id"]
        assert {r["env"]["SLURM_JOB_ID"] for r in recs} == {job}, recs
        assert {r["env"]["DISTENV_SCOPE"] for r in recs} == {f"slurm/{job}/0"}, recs


def test_array_elements_on_one_node_get_their_own_scope_and_port(harness: Harness) -> None:
    """`sbatch --array=0-1 -n 2` whose elements each run a 2-task srun step on the one node, at
    the same time (their ranks meet before leaving the process group): both finish their
    all_reduce, on different scopes and ports. Guards 0.1.0's behaviour (scope = element's job)."""
    meeting = harness.outdir("meet")
    step = " ".join(["exec", "srun", *rank_check("--meet", str(meeting), "4")])  # paths only
    launch = harness.sbatch(None, cluster="one", options=["--array=0-1", "-n", "2", "--wrap", step],
                            label="array")  # fmt: skip
    result = launch.wait().ok()
    elements = {}
    for index in ("0", "1"):
        files = {n: b for n, b in result.files.items() if n.endswith(f"-{index}.out")}
        element = Result(result.argv, result.returncode, "", "", result.seconds, files)
        recs = check_world(
            element, launcher="slurm", layouts=[(r, 2, r, 2, 0, 1) for r in range(2)]
        )
        assert {r["env"]["SLURM_ARRAY_TASK_ID"] for r in recs} == {index}, result.text
        assert [r["met"] for r in recs] == [4, 4], result.text  # both elements' groups were up
        elements[index] = recs[0]
    first, second = elements["0"], elements["1"]
    assert first["env"]["SLURM_ARRAY_JOB_ID"] == second["env"]["SLURM_ARRAY_JOB_ID"]
    assert first["info"]["job_id"] != second["info"]["job_id"]
    assert first["env"]["DISTENV_SCOPE"] != second["env"]["DISTENV_SCOPE"]
    assert first["info"]["master_port"] != second["info"]["master_port"]
    assert first["info"]["master_addr"] == second["info"]["master_addr"] == socket.gethostname()


def test_hf_trainer_on_two_nodes(harness: Harness) -> None:
    """docs/start/huggingface.md's Trainer recipe, with init_dist() for setup(), under
    `srun -N 2`: one rank per node, the Trainer joins distenv's group and both ranks train as one."""
    code = script(
        "tests/integration/test_slurm.py::test_hf_trainer_on_two_nodes",
        HF_TRAINER_PARTS,
        HF_TRAINER_REPORT,
        replace=[("distenv.setup()", "distenv.init_dist()")],
    )
    srun = [*SRUN, "-N", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1", PYTHON]
    launched = launch(
        harness, "hf-trainer-srun", code, start=srun, cluster="multi", extra_env=HF_OFFLINE
    )
    recs = check(*launched)
    assert [(r["group_size"], r["steps"], r["node_rank"]) for r in recs] == [
        (2, HF_TRAINER_STEPS, 0),
        (2, HF_TRAINER_STEPS, 1),
    ]
