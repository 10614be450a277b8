"""The roll call over a real TCPStore, and its validation as a table."""

from __future__ import annotations

import threading
import time

import pytest

from distenv import RankInfo, detect
from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.rollcall import roll_call
from distenv.bootstrap.session import Bootstrap, Session
from distenv.bootstrap.verdict import Verdict, validate
from distenv.deadline import Deadline
from distenv.errors import RendezvousError, RendezvousTimeoutError
from distenv.timing import MARGIN_S
from tests.support.envs import Layout, flux, layout


def checkin(rank: int, world: int = 4, per_node: int = 2, **change: object) -> CheckIn:
    base = CheckIn(
        rank=rank,
        world_size=world,
        local_rank=rank % per_node,
        local_world_size=per_node,
        node_rank=rank // per_node,
        hostname=f"n{rank // per_node + 1}",
        pid=1000 + rank,
        launcher="slurm",
        master="n1:12345",
        backend="gloo",
        torch_version="2.13.0",
        scope="slurm/7/0",
    )
    return base._replace(**change)  # type: ignore[arg-type]


def boot(info: RankInfo, timeout: float, within: float, scope: str = "slurm/7/0") -> Bootstrap:
    """Return the bootstrap of `info`'s rank: rendezvous timeout `timeout`, every wait over within
    `within` seconds from now."""
    return Bootstrap(Session(info, scope), timeout, Deadline.after(within + MARGIN_S))


def test_validate_accepts_a_healthy_job() -> None:
    """Four ranks on two hosts, all agreeing: no problems."""
    assert validate([checkin(r) for r in range(4)], 4) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        ({1: {"world_size": 8}}, "ranks disagree on world_size: 4 on ranks 0, 2, 3; 8 on ranks 1"),
        ({3: {"master": "n2:12345"}}, "ranks disagree on master"),
        ({2: {"backend": "nccl"}}, "ranks disagree on backend"),
        ({0: {"torch_version": "2.12.0"}}, "ranks disagree on torch_version"),
        (
            {3: {"rank": 2, "pid": 77}},
            "rank 2 was claimed by 2 processes (pid 1002 on 'n2', pid 77 on 'n2')",
        ),
        ({1: {"local_rank": 0}}, "2 ranks on 'n1' (node 0) share local rank 0"),
        (
            {0: {"device": "GPU-5a3e"}, 1: {"device": "GPU-5a3e"}},
            "ranks 0, 1 on 'n1' drive the same GPU (GPU-5a3e)",
        ),
    ],
)
def test_validate_names_each_problem(mutate: dict[int, dict[str, object]], expected: str) -> None:
    """Disagreements, duplicate ranks, shared local ranks and shared GPUs are each named."""
    checkins = [checkin(r)._replace(**mutate.get(r, {})) for r in range(4)]  # type: ignore[arg-type]
    problems = [p.describe(0) for p in validate(checkins, 4)]
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            {2: {"node_rank": None}, 3: {"node_rank": None}},
            "ranks 0, 1 (on 'n1') have a node_rank from their launcher's variables but ranks 2, 3 "
            "(on 'n2') have none: the ranks were not started alike",
        ),
        (
            {0: {"local_world_size": None}},
            "ranks 1, 2, 3 (on 'n1', 'n2') have a local_world_size from their launcher's variables "
            "but ranks 0 (on 'n1') have none",
        ),
        (
            {0: {"local_world_size": 3}, 1: {"local_world_size": 3}},
            "2 ranks of this job run on 'n1' (node 0) (ranks 0, 1), but their launcher gave them "
            "local_world_size 3 and local ranks 0, 1, not local ranks 0..1 of 2",
        ),
        (
            {1: {"local_rank": 3, "local_world_size": 4}},
            "2 ranks of this job run on 'n1' (node 0) (ranks 0, 1), but their launcher gave them "
            "local_world_size 2, 4 and local ranks 0, 3, not local ranks 0..1 of 2",
        ),
        (
            {2: {"node_rank": 0}, 3: {"node_rank": 0}},
            "ranks that their launcher's variables put on node 0 run on ['n1', 'n2']",
        ),
    ],
    ids=["node-index-mixed", "local-size-mixed", "local-size", "local-rank", "node-on-two-hosts"],
)
def test_layouts_that_contradict_the_hosts_are_named(
    mutate: dict[int, dict[str, object]], expected: str
) -> None:
    """Known node indices and local layouts are checked against the hosts the roll call counts."""
    checkins = [checkin(r)._replace(**mutate.get(r, {})) for r in range(4)]  # type: ignore[arg-type]
    problems = [p.describe(0) for p in validate(checkins, 4)]
    assert any(expected in p for p in problems), problems


def test_flux_local_ranks_are_checked_against_the_hosts_counted() -> None:
    """Flux names local ranks but no local size: they must be 0..n-1 for the n ranks of a host."""
    flux_like = [
        checkin(r, launcher="flux", node_rank=None, local_world_size=None)._replace(
            hostname=f"fluke{r // 2 + 1}"
        )
        for r in range(4)
    ]
    assert validate(flux_like, 4) == []
    # Two tasks of one host claiming local rank 0: named, not numbered.
    twice = [*flux_like[:3], flux_like[3]._replace(local_rank=0)]
    assert [p.describe(0) for p in validate(twice, 4)] == ["2 ranks on 'fluke2' share local rank 0"]
    # A local rank past the ranks of its host: named with the host, the ranks and the fix
    # (docs/troubleshooting.md shows this message).
    beyond = [*flux_like[:3], flux_like[3]._replace(local_rank=2)]
    (problem,) = validate(beyond, 4)
    assert problem.describe(0) == (
        "2 ranks of this job run on 'fluke2' (ranks 2, 3), but their launcher gave them local ranks "
        "0, 2, not local ranks 0..1 of 2: its local variables do not describe these ranks; let "
        "the launcher set them (unset any inherited from another job or set by hand)"
    )
    # An incomplete world is not counted (missing ranks are named instead).
    assert validate(beyond[:3], 4)[0].describe(0).startswith("1 of 4 ranks did not check in")


def test_gpu_sharing_can_be_allowed() -> None:
    """Two ranks on one GPU are fine when every one of them allowed sharing."""
    checkins = [checkin(r, device="GPU-9f", allow_gpu_sharing=True, hostname="h") for r in range(2)]
    checkins = [c._replace(local_rank=i) for i, c in enumerate(checkins)]
    assert validate(checkins, 2) == []


def test_mpi_placement_is_checked_against_hostnames() -> None:
    """A node index MPI's variables name (a daemon step's, PALS_NODEID) must match the hosts.

    Where they name none (node_rank None), the roll call numbers the hosts: nothing to check.
    """
    checkins = [checkin(r, launcher="mpi", hostname=f"h{r % 2}") for r in range(4)]
    problems = [p.describe(0) for p in validate(checkins, 4)]
    assert any("node variables do not describe these ranks" in p for p in problems)
    unnamed = [c._replace(node_rank=None, local_rank=c.rank // 2) for c in checkins]
    assert validate(unnamed, 4) == []


def _run_ranks(
    world: int, timeout: float, present: list[int], **change: object
) -> dict[int, object]:
    """Run the roll call for `present` ranks as threads over one real TCPStore."""
    from torch.distributed import PrefixStore, TCPStore

    master = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    port = master.port
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        store = master if rank == 0 else TCPStore("127.0.0.1", port, world, False)
        info = RankInfo(
            launcher="slurm",
            rank=rank,
            world_size=world,
            local_rank=rank % 2,
            local_world_size=2,
            node_rank=rank // 2,
            num_nodes=(world + 1) // 2,
            master_addr="127.0.0.1",
            master_port=port,
        )
        try:
            results[rank] = roll_call(
                PrefixStore("distenv/test", store),
                boot(info, timeout, timeout + 10),
                checkin(rank, world, **change),
            )
        except RendezvousError as exc:
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in present]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return results


def test_roll_call_succeeds_with_everyone() -> None:
    """Four ranks check in; all get a positive verdict; rank 0 alone keeps the four records.

    The others receive the outcome without the records: O(N) bytes from the store, not O(N^2).
    """
    results = _run_ranks(4, 10, [0, 1, 2, 3])
    assert sorted(results) == [0, 1, 2, 3]
    for rank, verdict in results.items():
        assert isinstance(verdict, Verdict)
        assert verdict.ok
        expected = [0, 1, 2, 3] if rank == 0 else []
        assert sorted(c.rank for c in verdict.checkins) == expected


def _filled(
    hosts: list[str],
    local_rank: list[int],
    node_rank: list[int | None],
    *,
    local_size: list[int | None] | None = None,
    num_nodes: int | None = None,
    launcher: str = "mpi",
) -> dict[int, RankInfo | RendezvousError]:
    """Hold a roll call of ranks on `hosts` (by default MPI's: local sizes known, no node count);
    return each rank's filled RankInfo, or the error it raised."""
    from torch.distributed import PrefixStore, TCPStore

    from distenv.bootstrap.rollcall import fill_layout

    world = len(hosts)
    sizes = local_size if local_size is not None else [hosts.count(h) for h in hosts]
    master = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    port = master.port
    filled: dict[int, RankInfo | RendezvousError] = {}

    def rank_main(rank: int) -> None:
        store = master if rank == 0 else TCPStore("127.0.0.1", port, world, False)
        info = RankInfo(
            launcher=launcher, rank=rank, world_size=world, local_rank=local_rank[rank],
            local_world_size=sizes[rank], node_rank=node_rank[rank], num_nodes=num_nodes,
            master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        mine = checkin(rank, world, launcher=launcher, hostname=hosts[rank])
        mine = mine._replace(
            local_rank=local_rank[rank], local_world_size=sizes[rank], node_rank=node_rank[rank]
        )
        try:
            verdict = roll_call(PrefixStore("distenv/test", store), boot(info, 10, 20), mine)
            filled[rank] = fill_layout(info, verdict, mine)
        except RendezvousError as exc:
            filled[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert len(filled) == world, filled
    return filled


def _filled_layouts(
    hosts: list[str], local_rank: list[int], node_rank: list[int | None]
) -> dict[int, tuple[int | None, int | None]]:
    """Hold a roll call of MPI ranks on `hosts`, no node count given; return each filled layout."""
    filled = _filled(hosts, local_rank, node_rank)
    layouts = {r: (i.node_rank, i.num_nodes) for r, i in filled.items() if isinstance(i, RankInfo)}
    assert len(layouts) == len(hosts), filled
    return layouts


def test_roll_call_numbers_the_nodes_a_launcher_left_unknown() -> None:
    """MPI ranks placed round-robin on two hosts, named in reverse order, no node layout given.

    Rank 0 numbers the hosts in order of their lowest rank (its own host is node 0, whatever its
    name), and every rank, reading only the published verdict, takes its host's place.
    """
    layouts = _filled_layouts(["zeta", "alpha", "zeta", "alpha"], [0, 0, 1, 1], [None] * 4)
    assert layouts == {0: (0, 2), 1: (1, 2), 2: (0, 2), 3: (1, 2)}


@pytest.mark.parametrize(
    ("envs", "hosts", "answers"),
    [
        (flux.FLUX_2X2, ["fluke1", "fluke1", "fluke2", "fluke2"], flux.FLUX_2X2_ANSWERS),
        (flux.FLUX_CYCLIC_5, flux.FLUX_CYCLIC_5_HOSTS, flux.FLUX_CYCLIC_5_ANSWERS),
    ],
    ids=["2x2", "cyclic-uneven"],
)
def test_roll_call_fills_flux_node_and_local_size(
    envs: list[dict[str, str]], hosts: list[str], answers: list[Layout]
) -> None:
    """Flux tasks on several nodes, several per node (block, or cyclic and uneven): detection
    leaves the node index and the local size unknown; the roll call numbers each task's host and
    counts the tasks on it, and the local rank stays FLUX_TASK_LOCAL_ID.
    """
    detected = [detect("auto", env) for env in envs]
    filled = _filled(
        hosts,
        [i.local_rank for i in detected],
        [i.node_rank for i in detected],
        local_size=[i.local_world_size for i in detected],
        num_nodes=detected[0].num_nodes,
        launcher="flux",
    )
    assert {r: layout(i) for r, i in filled.items() if isinstance(i, RankInfo)} == dict(
        enumerate(answers)
    ), filled


def test_a_verdict_that_does_not_count_this_hosts_ranks_is_refused() -> None:
    """A rank with no local size, given a verdict that names its host without counting: refused."""
    from distenv.bootstrap.rollcall import fill_layout

    info = RankInfo(
        launcher="flux", rank=1, world_size=2, local_rank=0, local_world_size=None,
        node_rank=None, num_nodes=2, master_addr="h", master_port=1,
    )  # fmt: skip
    mine = checkin(1, 2, hostname="b", node_rank=None, local_world_size=None, local_rank=0)
    with pytest.raises(RendezvousError, match="does not count the ranks on this rank's host 'b'"):
        fill_layout(info, Verdict(True, (), (), "flux/1/-/n2", ("a", "b")), mine)
    counted = Verdict(True, (), (), "flux/1/-/n2", ("a", "b"), (1, 1))
    assert layout(fill_layout(info, counted, mine)) == (1, 2, 0, 1, 1, 2)


def test_a_verdict_that_does_not_name_this_host_is_refused() -> None:
    """A verdict numbering other hosts (forged, or a host renamed mid-start): a clear error."""
    from distenv.bootstrap.rollcall import fill_layout

    info = RankInfo(
        launcher="mpi", rank=1, world_size=2, local_rank=0, local_world_size=1,
        node_rank=None, num_nodes=None, master_addr="h", master_port=1,
    )  # fmt: skip
    verdict = Verdict(True, (), (), "mpi/-/2/n2", ("a", "b"))
    with pytest.raises(RendezvousError, match="does not place this rank's host 'c'"):
        fill_layout(info, verdict, checkin(1, 2, hostname="c", node_rank=None))
    assert fill_layout(info, verdict, checkin(1, 2, hostname="b", node_rank=None)).node_rank == 1


def test_missing_rank_is_named_with_its_host_within_the_timeout() -> None:
    """World size 4, rank 3 never starts: rank 0 fails in ~timeout naming rank 3 and node n2."""
    start = time.monotonic()
    results = _run_ranks(4, 2.0, [0, 1, 2])
    elapsed = time.monotonic() - start
    error = results[0]
    assert isinstance(error, RendezvousTimeoutError)
    assert "1 of 4 ranks did not check in within 2 s: rank 3 (expected on 'n2')" in str(error)
    assert elapsed < 2.0 + 10
    assert all(isinstance(results[r], RendezvousTimeoutError) for r in (1, 2))


def test_duplicate_gpu_fails_every_rank() -> None:
    """A verdict with problems is raised on every rank, naming the problem."""
    results = _run_ranks(2, 10, [0, 1], device="GPU-0b1c", hostname="h", local_rank=0)
    for rank in (0, 1):
        error = results[rank]
        assert isinstance(error, RendezvousError)
        assert "drive the same GPU (GPU-0b1c)" in str(error)


def test_store_round_trips_per_rank() -> None:
    """The hardened rendezvous costs each rank at most 2 store round trips more than 0.1.0's,
    and the ranks that wait for rank 0 never poll.

    0.1.0's roll call, per rank other than 0: add, set, add, get(verdict), add(read) and its polls
    of the verdict; rank 0: add, set, add, multi_get, add, set(verdict) and its polls of the
    counts. Now the others peek at the scope before writing (one compare_set, `peek`), claim their
    rank's key (compare_set), count themselves (add) and wait in the store for the verdict (one
    ``get``: a WAIT and a GET on the wire, however long rank 0 takes), and no longer acknowledge
    an OK verdict; rank 0 claims the scope and publishes the verdict with compare_set. Rank 0
    claims before the others start here, so that each count is exact.
    """
    import datetime
    from collections import Counter

    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    from distenv.bootstrap.group import group_up

    class Counting(dist.Store):  # type: ignore[misc]
        def __init__(self, inner: dist.Store) -> None:
            super().__init__()
            self.inner, self.ops = inner, Counter[str]()

        def set(self, key: str, value: object) -> None:
            self.ops["set"] += 1
            self.inner.set(key, value)

        def get(self, key: str) -> bytes:
            self.ops["get"] += 1
            return bytes(self.inner.get(key))

        def add(self, key: str, amount: int) -> int:
            self.ops["add"] += 1
            return int(self.inner.add(key, amount))

        def check(self, keys: list[str]) -> bool:
            self.ops["check"] += 1
            return bool(self.inner.check(keys))

        def compare_set(self, key: str, expected: object, desired: object) -> bytes:
            self.ops["compare_set"] += 1
            return bytes(self.inner.compare_set(key, expected, desired))

        def multi_get(self, keys: list[str]) -> list[bytes]:
            self.ops["multi_get"] += 1
            return [bytes(v) for v in self.inner.multi_get(keys)]

        def multi_set(self, keys: list[str], values: list[object]) -> None:
            self.ops["multi_set"] += 1
            self.inner.multi_set(keys, values)

    world = 4
    timeout = datetime.timedelta(seconds=30)
    server = TCPStore("127.0.0.1", 0, world, True, timeout=timeout, wait_for_workers=False)
    port = server.port
    stores = {
        r: Counting(server if r == 0 else TCPStore("127.0.0.1", port, world, False))
        for r in range(world)
    }
    scope = "slurm/7/0/n4"
    verdicts: dict[int, object] = {}
    rollcall_ops: dict[int, Counter[str]] = {}

    def rank_main(rank: int) -> None:
        info = RankInfo(
            launcher="slurm", rank=rank, world_size=world, local_rank=rank % 2,
            local_world_size=2, node_rank=rank // 2, num_nodes=2,
            master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        rank_boot = boot(info, 30, 40, scope)
        session = rank_boot.session
        session.store, scope_check = stores[rank], None
        if rank != 0:
            scope_check = session.check(Deadline.after(30))
            assert scope_check.poll()
        verdicts[rank] = roll_call(
            PrefixStore(session.keys("rollcall"), session.store),
            rank_boot,
            checkin(rank, world),
            scope_check=scope_check,
        )
        rollcall_ops[rank] = Counter(stores[rank].ops)
        # The liveness check after init_process_group (the "joining" mark comes before it).
        session.mark("joining")
        group_up(Bootstrap(session, 30, Bootstrap.deadline_for(30)), hosts={})

    zero = boot(
        RankInfo(launcher="slurm", rank=0, world_size=world, local_rank=0, local_world_size=2,
                 node_rank=0, num_nodes=2, master_addr="127.0.0.1", master_port=port),
        30, 40, scope,
    )  # fmt: skip
    zero.session.store = stores[0]
    zero.session.claim()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(v, Verdict) and v.ok for v in verdicts.values()), verdicts
    # The one rank whose count completed the check-in count wrote the word that says so (a
    # set), and so did the one that completed the group-up count.
    words = 0
    checked = rollcall_ops[0]["set"]
    for rank in range(1, world):
        ops, rollcall = stores[rank].ops, rollcall_ops[rank]
        group = ops - rollcall
        # Roll call: peek(scope), claim, count, and one wait in the store for the verdict.
        checked += rollcall["set"]
        assert rollcall == Counter(compare_set=2, add=1, get=1, set=rollcall["set"])
        # 0.1.0: 5 round trips + its polls of the verdict (>= 1), so 6 at least, for the roll
        # call, and no group-up check. Now 4.
        # Group-up: set(joining), set(up with its token), add(count), then one wait in the store
        # for its own acknowledgement: 4, 8 in all, 2 more than 0.1.0 (one more for the rank
        # that completed the count: the word).
        words += group["set"] - 2
        assert group == Counter(set=2 + (group["set"] == 3), add=1, get=1)
    rank0 = rollcall_ops[0]
    # The scope claim, its own check-in's claim and the verdict (0.1.0: add, set, set).
    assert rank0["compare_set"] == 3
    assert checked == 1
    assert rank0["check"] == 1  # before the multi_get, which would wait for a missing key
    assert rank0["multi_get"] == 1
    # Rank 0's group-up check reads every rank's record in one multi_get and acknowledges the
    # others in one multi_set: O(1) requests per rank at rank 0's store, whatever the world.
    group0 = stores[0].ops - rank0
    assert group0["multi_get"] == 1
    assert group0["multi_set"] == 1
    # Rank 0 looks at the count once; short, it waits in the store for the word (one get), then
    # reads the count once more: its adds are its own count, those looks and the read of the
    # extra claims, where polling the count took one every 0.2-0.5 ms until the last rank
    # counted itself.
    words += group0["set"] - 2
    waited = group0["get"]
    assert waited in (0, 1), group0
    assert group0["add"] == 3 + waited, group0
    assert words == 1


def _scoped_stores(world: int) -> tuple[object, dict[int, object], int]:
    import datetime

    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=30)
    server = TCPStore("127.0.0.1", 0, world, True, timeout=timeout, wait_for_workers=False)
    port = server.port
    clients = {r: TCPStore("127.0.0.1", port, world, False) for r in range(1, world)}
    return server, clients, port


def _info(rank: int, world: int, port: int) -> RankInfo:
    return RankInfo(
        launcher="slurm", rank=rank, world_size=world, local_rank=rank % 2,
        local_world_size=2, node_rank=rank // 2, num_nodes=world // 2,
        master_addr="127.0.0.1", master_port=port,
    )  # fmt: skip


def test_ranks_check_in_before_a_late_rank_0_claims_the_scope() -> None:
    """Rank 0 arrives last: the others have checked in by then (they did not wait for its claim),
    confirm the scope once it is there, and pass; rank 0 finds the count complete at once."""
    from torch.distributed import PrefixStore

    world, scope = 4, "slurm/8/0/n4"
    server, clients, port = _scoped_stores(world)
    sessions = {r: Session(_info(r, world, port), scope) for r in range(world)}
    rollcall = sessions[0].keys("rollcall")
    verdicts: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        session = sessions[rank]
        session.store = clients[rank]
        scope_check = session.check(Deadline.after(30))
        assert not scope_check.poll()  # rank 0 has not claimed yet
        try:
            verdicts[rank] = roll_call(
                PrefixStore(rollcall, session.store), boot(session.info, 30, 40, scope),
                checkin(rank, world), scope_check=scope_check,
            )  # fmt: skip
        except Exception as exc:
            verdicts[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(1, world)]
    for t in threads:
        t.start()
    written = PrefixStore(rollcall, server)
    deadline = time.monotonic() + 30
    while int(written.add("written", 0)) < world - 1:
        assert time.monotonic() < deadline, "ranks 1-3 waited for rank 0 before checking in"
        time.sleep(0.01)
    sessions[0].store = server
    sessions[0].claim()
    verdicts[0] = roll_call(written, boot(_info(0, world, port), 30, 40, scope), checkin(0, world))
    for t in threads:
        t.join(60)
    assert all(isinstance(v, Verdict) and v.ok for v in verdicts.values()), verdicts


def test_a_scope_claimed_by_another_job_after_check_in_is_refused() -> None:
    """The key was absent when rank 1 looked, then another job's rank 0 claimed it: rank 1 stops
    with StoreTakenError, saying it wrote only its check-in under its own job's keys."""

    from distenv.errors import StoreTakenError

    world, scope = 2, "slurm/9/0/n2"
    server, clients, port = _scoped_stores(world)
    session = Session(_info(1, world, port), scope)
    session.store = clients[1]
    scope_check = session.check(Deadline.after(30))
    assert not scope_check.poll()
    other_job = Session(_info(0, world, port), "slurm/10/0/n2")
    other_job.store = server
    other = threading.Timer(0.3, other_job.claim)
    other.start()
    start = time.monotonic()
    with pytest.raises(StoreTakenError) as refused:
        roll_call(
            session.scoped("rollcall"), boot(session.info, 30, 40, scope), checkin(1, world),
            scope_check=scope_check,
        )  # fmt: skip
    other.join()
    assert time.monotonic() - start < 5
    message = str(refused.value)
    assert "is another job's: slurm/10/0/n2; this job is slurm/9/0/n2" in message
    assert "wrote only its check-in, under this job's own keys" in message


def test_roll_call_counts_the_nodes_when_only_the_node_count_is_unknown() -> None:
    """Cray PALS: PALS_NODEID names each rank's node but nothing counts the nodes.

    Every check-in carries a node index, yet the ranks still need the count: rank 0 publishes the
    hosts whenever its own layout is incomplete, and each rank keeps its launcher's node index.
    """
    hosts = ["x1000c0s0b0n0", "x1000c0s0b0n0", "x1000c0s0b0n1", "x1000c0s0b0n1"]
    layouts = _filled_layouts(hosts, [0, 1, 0, 1], [0, 0, 1, 1])
    assert layouts == {0: (0, 2), 1: (0, 2), 2: (1, 2), 3: (1, 2)}


def test_a_rank_that_checks_in_after_rank_0_gave_up_is_told_it_came_late() -> None:
    """World 3, rank 2 absent: rank 0 closes rank 2's key before naming it missing, so rank 2,
    arriving afterwards, learns at once that it came late instead of waiting for a verdict."""
    from torch.distributed import PrefixStore, TCPStore

    world = 3
    master = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    port = master.port
    results: dict[int, object] = {}

    def rank_main(rank: int, timeout: float) -> None:
        store = master if rank == 0 else TCPStore("127.0.0.1", port, world, False)
        info = RankInfo(
            launcher="slurm", rank=rank, world_size=world, local_rank=rank % 2,
            local_world_size=2, node_rank=rank // 2, num_nodes=2,
            master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        try:
            results[rank] = roll_call(
                PrefixStore("distenv/test", store), boot(info, timeout, timeout + 10),
                checkin(rank, world),
            )  # fmt: skip
        except RendezvousError as exc:
            results[rank] = exc

    first = [threading.Thread(target=rank_main, args=(r, 1.0)) for r in (0, 1)]
    for t in first:
        t.start()
    for t in first:
        t.join(30)
    assert "1 of 3 ranks did not check in within 1 s: rank 2" in str(results[0])
    start = time.monotonic()
    rank_main(2, 10.0)
    error = results[2]
    assert isinstance(error, RendezvousTimeoutError)
    assert "rank 2 of 3 reached the roll call at n1:12345 after rank 0 had stopped waiting" in str(
        error
    )
    assert time.monotonic() - start < 5  # at once, not after its own 10 s wait


def test_a_rank_whose_key_was_taken_never_accepts_a_positive_verdict() -> None:
    """World 2 passes its roll call; a second process of rank 1, of the same identity, arrives
    after the verdict: it files an extra claim (which rank 0 reads before it acknowledges the
    group) and refuses the positive verdict, naming the collision, at once (#44 item 2)."""
    from torch.distributed import PrefixStore, TCPStore

    from distenv.bootstrap.problems import SAME_IDENTITY

    world = 2
    master = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    port = master.port
    results: dict[tuple[int, int], object] = {}

    def rank_main(rank: int, pid: int) -> None:
        store = master if rank == 0 else TCPStore("127.0.0.1", port, world, False)
        info = RankInfo(
            launcher="slurm", rank=rank, world_size=world, local_rank=rank,
            local_world_size=2, node_rank=0, num_nodes=1,
            master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        record = checkin(rank, world, per_node=2, pid=pid)
        try:
            results[rank, pid] = roll_call(
                PrefixStore("distenv/test", store), boot(info, 10.0, 20.0), record
            )
        except RendezvousError as exc:
            results[rank, pid] = exc

    first = [threading.Thread(target=rank_main, args=(r, 1000 + r)) for r in (0, 1)]
    for t in first:
        t.start()
    for t in first:
        t.join(30)
    assert all(isinstance(results[r, 1000 + r], Verdict) for r in (0, 1)), results
    start = time.monotonic()
    rank_main(1, 2000)
    error = results[1, 2000]
    assert isinstance(error, RendezvousError)
    assert SAME_IDENTITY in str(error)
    assert "another process claimed rank 1 before this one" in str(error)
    assert "TORCHELASTIC_RUN_ID" in str(error)
    assert int(master.add("distenv/test/extras", 0)) == 1
    assert time.monotonic() - start < 5
