"""The faults of issue #13, each injected into a real launch, and what every rank then did.

A `Fault` starts tests/support/scripts/faulty_rank.py under one real launcher (srun on the simulated
multi-node cluster without ``--kill-on-bad-exit``, Open MPI's mpirun, MPICH's Hydra, torchrun,
``distenv run``), injects its fault (the rank script kills, stops or holds itself at a point of
init_dist, or the driver here signals a rank once it reports a phase, or a plain socket listens
on the master port and never answers), and returns an `Outcome`: every rank's events with wall
times, the launcher's exit status and output, each rank's exit as the launcher reported it where
it does, and the processes of the launch still in /proc after the launcher returned.

tests/integration/test_faults.py asserts on the outcomes; benchmarks/lab/fault_matrix.py runs each fault
once and records the measured times for docs/faults.md. Both use these definitions, so the page
describes exactly what the tests check.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distenv.master import free_port
from distenv.timing import GRACE_S
from tests.support.integration.helpers import (
    JOB_NAME,
    OMPI,
    PYTHON,
    REPO,
    TORCHRUN,
    Harness,
    Launch,
    Result,
)

FAULTY = str(REPO / "tests" / "support" / "scripts" / "faulty_rank.py")
DISTENV = str(REPO / ".venv" / "bin" / "distenv")
# Seconds a rank may take beyond its deadline to print its error and exit.
EXIT_SLACK_S = 3.0
# Seconds a launch may take beyond the bound: interpreter start and `import torch` of every rank
# on 2 cores (with other launches running), which happen before init_dist and its deadline.
START_SLACK_S = 60.0
# A signal ends a rank within this (issue #13, item 2).
SIGNAL_BOUND_S = 2.0
# After the launcher returned, the processes of the launch must be gone within this (slurmstepd
# and the MPI daemons reap asynchronously).
REAP_S = 3.0


@dataclass
class Outcome:
    """What one fault did to one launch."""

    fault: str
    launcher: str
    timeout: float
    result: Result
    events: dict[int, list[dict[str, Any]]]
    fault_t: float  # wall time of the fault (time.time())
    survivors: list[str]
    stopped_pid: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def bound(self) -> float:
        """The bootstrap's bound: the rendezvous timeout + the grace."""
        return self.timeout + GRACE_S

    def first(self, rank: int, event: str) -> dict[str, Any] | None:
        """Return `rank`'s first `event`, if any."""
        return next((e for e in self.events.get(rank, []) if e["event"] == event), None)

    def errors(self) -> dict[int, dict[str, Any]]:
        """Return each rank's error event, by rank."""
        found = {rank: self.first(rank, "error") for rank in self.events}
        return {rank: e for rank, e in sorted(found.items()) if e is not None}

    def measured(self) -> float:
        """Seconds from the fault to the last rank's error."""
        return max(e["t"] for e in self.errors().values()) - self.fault_t

    def task_exits(self) -> dict[int, str]:
        """Each rank's end as the launcher reported it (srun, torchrun), e.g. ``exit 1``."""
        text = self.result.stderr
        exits: dict[int, str] = {}
        for tasks, how, code in re.findall(
            r"srun: error: \S+: tasks? ([\d,-]+): (Exited with exit code (\d+)|Killed|Terminated)",
            text,
        ):
            for task in _task_ids(tasks):
                exits[task] = f"exit {code}" if code else how.lower()
        for rank, code in re.findall(r"rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)",
                                     text):  # fmt: skip
            exits[int(rank)] = f"exit {code}" if int(code) >= 0 else f"signal {-int(code)}"
        return exits

    def text(self) -> str:
        """Everything, for assertion messages."""
        lines = [self.result.text, f"fault at {self.fault_t:.3f}; survivors {self.survivors}"]
        for rank, evs in sorted(self.events.items()):
            lines += [f"rank {rank}: {json.dumps(e)[:600]}" for e in evs]
        return "\n".join(lines)

    def record(self, named: str) -> dict[str, Any]:
        """Return the JSON record of the fault matrix."""
        errors = self.errors()
        last = max(errors.values(), key=lambda e: e["t"]) if errors else None
        named_by = [r for r, e in errors.items() if named in e["message"]]
        return {
            "fault": self.fault,
            "launcher": self.launcher,
            "timeout_s": self.timeout,
            "bound_s": self.bound,
            "measured_s": round(self.measured(), 3) if errors else None,
            "launcher_exit": self.result.returncode,
            "launch_s": round(self.result.seconds, 2),
            "rank_exits": {str(r): how for r, how in sorted(self.task_exits().items())},
            "errors": {str(r): e["message"] for r, e in errors.items()},
            "named": named,
            "named_by": named_by,
            "excerpt": excerpt(errors[named_by[0]]["message"] if named_by else last["message"])
            if last
            else "",
            "survivors": self.survivors,
        }


def _task_ids(text: str) -> list[int]:
    """Return the task ids of srun's ``0,2-3``."""
    ids: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids += range(int(low), int(high or low) + 1)
    return ids


def excerpt(message: str, limit: int = 220) -> str:
    """Return the message without distenv's hint, shortened to `limit` characters."""
    text = message.split(". Hint: ")[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_events(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Return the ranks' events by rank (lines still being written are skipped)."""
    events: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        rank = int(path.stem[4:])
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.setdefault(rank, []).append(json.loads(line))
    return events


def tagged(tag: str) -> list[str]:
    """Return ``pid: argv`` of every live (non-zombie) process with `tag` in its argv."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in argv and state != "Z":
            found.append(f"{entry.name}: {b' '.join(argv).decode(errors='replace')[:200]}")
    return found


def survivors(tag: str) -> list[str]:
    """Return the processes of the launch still alive `REAP_S` after the launcher returned."""
    until = time.monotonic() + REAP_S
    while (alive := tagged(tag)) and time.monotonic() < until:
        time.sleep(0.1)
    return alive


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """Listen on a free port, accept every connection and never answer; yield the port.

    The kernel picks the port as it binds: a port picked first and bound later can be taken in
    between (by another test's outgoing connection, whose source ports come from the same range).
    """
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


class Run:
    """One launch of faulty_rank.py: its events folder, tag and the launch itself."""

    def __init__(self, harness: Harness, label: str) -> None:
        self.harness = harness
        self.folder = harness.outdir(label)
        self.tag = f"fault-{label}-{uuid.uuid4().hex[:8]}"
        self.launch: Launch | None = None

    def start(self, argv: list[str], **options: Any) -> Launch:
        """Start the launch (`Harness.start`); `wait_for` ends it if its condition never holds."""
        self.launch = self.harness.start(argv, **options)
        return self.launch

    def rank_argv(self, *faults: str) -> list[str]:
        argv = [PYTHON, FAULTY, "--events", str(self.folder), "--tag", self.tag]
        for spec in faults:
            argv += ["--fault", spec]
        return argv

    def events(self) -> dict[int, list[dict[str, Any]]]:
        return read_events(self.folder)

    def wait_for(
        self, test: Callable[[dict[int, list[dict[str, Any]]]], Any], limit: float = 150.0
    ) -> Any:
        """Poll the events until `test` returns something true; return it."""
        until = time.monotonic() + limit
        while time.monotonic() < until:
            found = test(self.events())
            if found:
                return found
            time.sleep(0.02)
        # Ended here, its output in the message: left running, the launch would outlive its test
        # (and warn, when collected, inside another).
        ended = ""
        if self.launch is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.launch.proc.pid, signal.SIGKILL)
            out, err = self.launch.proc.communicate()
            ended = f"; the launch ended: {(out + err).decode(errors='replace')[-4000:]}"
        raise AssertionError(f"{self.tag}: condition not met in {limit} s: {self.events()}{ended}")


def has(events: dict[int, list[dict[str, Any]]], rank: int, event: str, **fields: Any) -> Any:
    """Return `rank`'s first `event` whose fields match, else None."""
    for e in events.get(rank, []):
        if e["event"] == event and all(e.get(k) == v for k, v in fields.items()):
            return e
    return None


def _env(run: Run, timeout: float, cluster: str | None = None, **extra: str) -> dict[str, str]:
    return run.harness.env(
        cluster, ompi=True, extra={"DISTENV_TIMEOUT": f"{timeout:g}", "PYTHONUNBUFFERED": "1",
                                   **extra},
    )  # fmt: skip


def _finish(run: Run, launch: Any, fault: str, launcher: str, timeout: float, fault_t: float,
            stopped_pid: int | None = None) -> Outcome:  # fmt: skip
    result = launch.wait()
    return Outcome(fault, launcher, timeout, result, run.events(), fault_t, survivors(run.tag),
                   stopped_pid)  # fmt: skip


def _fault_time(run: Run, rank: int) -> float:
    event = run.wait_for(lambda evs: has(evs, rank, "fault"))
    return float(event["t"])


# ---- the faults ---------------------------------------------------------------------------------

SRUN_2N = ["srun", "-J", JOB_NAME, "-N", "2", "-n", "4", "--ntasks-per-node", "2"]


def killed_after_checkin(harness: Harness) -> Outcome:
    """Rank 1 SIGKILLs itself right after its check-in while the roll call waits for late rank 3.

    srun -N 2 without --kill-on-bad-exit: Slurm leaves the other tasks running, so only distenv
    can end them. 0.1.0: the survivors waited silently in init_process_group until killed.
    """
    run, timeout = Run(harness, "killed-after-checkin"), 5.0
    launch = run.start(
        [*SRUN_2N, *run.rank_argv("1:kill-after-checkin", "3:late:3")],
        env=_env(run, timeout, "multi"),
        timeout=150,
    )
    fault_t = _fault_time(run, 1)
    return _finish(run, launch, "a rank SIGKILLed after its check-in, while the roll call waits "
                   "for a late rank", "srun -N 2 (no --kill-on-bad-exit)", timeout, fault_t)  # fmt: skip


def sigterm_two_in_roll_call(harness: Harness) -> Outcome:
    """SIGTERM to ranks 1 and 2 while the roll call waits for late rank 3 (srun -n 4, one node).

    0.1.0: ranks 1 and 2 exited with a message; ranks 0 and 3 hung.
    """
    run, timeout = Run(harness, "sigterm-two"), 6.0
    launch = run.start(
        ["srun", "-J", JOB_NAME, "-n", "4", *run.rank_argv("3:late:4")],
        env=_env(run, timeout, "one"),
        timeout=150,
    )
    starts = run.wait_for(
        lambda evs: (
            [has(evs, r, "start") for r in (1, 2)]
            if all(has(evs, r, "phase", phase="rollcall") for r in (1, 2))
            else None
        )
    )
    time.sleep(0.3)  # well inside the roll call's wait
    fault_t = time.time()
    for start in starts:
        os.kill(start["pid"], signal.SIGTERM)
    return _finish(run, launch, "SIGTERM to two ranks during the roll call", "srun -n 4",
                   timeout, fault_t)  # fmt: skip


def stopped_after_init(harness: Harness) -> Outcome:
    """Rank 2 SIGSTOPs itself once its init_process_group returned (Open MPI mpirun -np 4).

    The others' init returns too; the group-up check must name rank 2. The test SIGKILLs it once
    every other rank has ended.
    """
    return _stopped_in_group_up(harness, "stopped-after-init", "2:stop-after-init",
                                "a rank SIGSTOPped after init_process_group returned")  # fmt: skip


def _stopped_in_group_up(harness: Harness, name: str, fault: str, what: str) -> Outcome:
    """Launch 4 ranks under mpirun whose rank 2 stops itself by `fault`; kill it at the end."""
    run, timeout = Run(harness, name), 5.0
    port = free_port()
    launch = run.start(
        [*OMPI, "-np", "4", *run.rank_argv(fault)],
        env=_env(run, timeout, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        timeout=150,
    )
    fault_t = _fault_time(run, 2)
    pid = int(run.wait_for(lambda evs: has(evs, 2, "start"))["pid"])
    others = (0, 1, 3)
    starts = {r: run.wait_for(lambda evs, r=r: has(evs, r, "start")) for r in others}
    until = time.monotonic() + timeout + GRACE_S + 30
    while time.monotonic() < until:
        if all(has(run.events(), r, "error") or gone(starts[r]["pid"]) for r in others):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return _finish(run, launch, what, "mpirun (Open MPI) -np 4", timeout, fault_t,
                   stopped_pid=pid)  # fmt: skip


def stopped_after_publish(harness: Harness) -> Outcome:
    """Rank 2 SIGSTOPs itself inside init_process_group, right after gloo published its address
    and before it connected to any peer (Open MPI mpirun -np 4).

    gloo's connect then returns on the peers that connect to rank 2 and holds the others past its
    own timeout (docs/faults.md, "Which check proves the group"): the ones whose init returned
    name rank 2 in the group-up check, the others at the bootstrap's deadline. The test SIGKILLs
    it once every other rank has ended.
    """
    return _stopped_in_group_up(harness, "stopped-after-publish", "2:stop-after-publish",
                                "a rank SIGSTOPped in its gloo connect, its address published")  # fmt: skip


def forged_up_then_stopped(harness: Harness) -> Outcome:
    """Rank 2 writes the forged "all up" key and count, then SIGSTOPs itself (mpirun -np 4).

    0.2.0's group-up check trusted that key: the other ranks passed init_dist and hung in their
    first collective. The test SIGKILLs rank 2 once every other rank has ended.
    """
    return _stopped_in_group_up(harness, "forged-up-stopped", "2:forge-up-then-stop",
                                "a rank SIGSTOPped after forging the group-up keys")  # fmt: skip


def rank0_killed_in_init(harness: Harness) -> Outcome:
    """Rank 0 SIGKILLs itself on entering init_process_group, after the roll call (srun -N 2).

    Its store goes with it: the others must say so at once, not wait for their deadline.
    """
    run, timeout = Run(harness, "rank0-killed"), 5.0
    launch = run.start(
        [*SRUN_2N, *run.rank_argv("0:kill-in-init")], env=_env(run, timeout, "multi"), timeout=150
    )
    fault_t = _fault_time(run, 0)
    return _finish(run, launch, "rank 0 SIGKILLed after the roll call, in init_process_group",
                   "srun -N 2 (no --kill-on-bad-exit)", timeout, fault_t)  # fmt: skip


def killed_in_init_torchrun(harness: Harness) -> Outcome:
    """Rank 1 SIGKILLs itself in init_process_group under torchrun (the agent's store lives on).

    torchrun stops the other workers (SIGTERM): they end with distenv's message, not a hang.
    """
    run, timeout = Run(harness, "torchrun-killed"), 5.0
    launch = run.start(
        [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), *run.rank_argv("1:kill-in-init")[1:]],
        env=_env(run, timeout),
        timeout=150,
    )  # fmt: skip
    fault_t = _fault_time(run, 1)
    return _finish(run, launch, "a rank SIGKILLed in init_process_group",
                   "torchrun --nproc-per-node 4", timeout, fault_t)  # fmt: skip


def silent_master_port(harness: Harness) -> Outcome:
    """Node 1 of a `distenv run` job whose MASTER_PORT is held by a service that never answers."""
    run, timeout = Run(harness, "silent-listener"), 5.0
    with silent_listener() as port:
        launch = run.start(
            [DISTENV, "run", "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
             "127.0.0.1", "--master-port", str(port), "--run-id", run.tag,
             *run.rank_argv("ranks:2,3")[1:]],
            env=_env(run, timeout),
            timeout=150,
        )  # fmt: skip
        outcome = _finish(run, launch, "a listener on MASTER_PORT that accepts connections but "
                          "never answers", "distenv run --nnodes 2 (node 1)", timeout, 0.0)  # fmt: skip
    # The fault is there from the start: it is measured from each rank's entry into init_dist.
    outcome.fault_t = min(e["t"] for r in outcome.events if (e := outcome.first(r, "start")))
    outcome.notes.append(f"port {port}")
    return outcome


# ---- a signal in each phase ---------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """A phase of init_dist, how a rank is held in it, and the message a signal there gives."""

    name: str  # faulty_rank.py's phase event
    what: str  # as distenv's message says it
    hold: str  # the peer's fault that keeps rank `target` in the phase
    target: int
    signal: signal.Signals
    launcher: str


PHASES = {
    "connecting": Phase("connecting", "the connection to rank 0's store", "0:hold-start", 1,
                        signal.SIGINT, "distenv run -n 2"),
    "rollcall": Phase("rollcall", "the roll call", "1:hold-start", 0, signal.SIGTERM,
                      "mpiexec.hydra (MPICH) -np 2"),
    "init": Phase("init", "init_process_group", "1:hold-init", 0, signal.SIGTERM,
                  "torchrun --nproc-per-node 2"),
    "groupup": Phase("groupup", "the check that the group is up", "1:hold-groupup", 0,
                     signal.SIGINT, "distenv run -n 2"),
}  # fmt: skip
# Seconds the phase tests allow the rendezvous: longer than the test, so only the signal ends it.
PHASE_TIMEOUT_S = 60.0


def signal_in_phase(harness: Harness, name: str) -> tuple[Outcome, float]:
    """Hold a peer so that the target rank waits in phase `name`, then signal the target.

    Returns the outcome and the seconds from the signal until the target's process had exited.
    """
    phase = PHASES[name]
    run, timeout = Run(harness, f"signal-{name}"), PHASE_TIMEOUT_S
    ranks = run.rank_argv(phase.hold)
    port = str(free_port())
    if phase.launcher.startswith("distenv run"):
        argv = [DISTENV, "run", "-n", "2", *ranks[1:]]
        env = _env(run, timeout)
    elif phase.launcher.startswith("torchrun"):
        argv = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", port, *ranks[1:]]  # fmt: skip
        env = _env(run, timeout)
    else:
        argv = ["mpiexec.hydra", "-np", "2", *ranks]
        env = run.harness.env(
            mpich=True,
            extra={"DISTENV_TIMEOUT": f"{timeout:g}", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port},
        )  # fmt: skip
    launch = run.start(argv, env=env, timeout=150)
    start = run.wait_for(
        lambda evs: (
            has(evs, phase.target, "start")
            if has(evs, phase.target, "phase", phase=phase.name)
            else None
        )
    )
    time.sleep(0.5)  # inside the phase's wait
    pid = int(start["pid"])
    fault_t = time.time()
    os.kill(pid, phase.signal)
    until = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < until:
        time.sleep(0.01)
    exited = time.time() - fault_t
    # The held peer is the test's helper: a launcher that does not stop the others on a failure
    # (Hydra without MPI_Init) would wait for it, so it is killed once the target has ended.
    time.sleep(1.0)
    for rank, evs in run.events().items():
        held = next((e for e in evs if e["event"] == "fault"), None)
        if rank != phase.target and held is not None and not gone(held["pid"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(held["pid"], signal.SIGKILL)
    outcome = _finish(run, launch, f"{phase.signal.name} during {phase.what}", phase.launcher,
                      timeout, fault_t)  # fmt: skip
    return outcome, exited


FAULTS: dict[str, Callable[[Harness], Outcome]] = {
    "killed-after-checkin": killed_after_checkin,
    "sigterm-two-in-roll-call": sigterm_two_in_roll_call,
    "stopped-after-init": stopped_after_init,
    "forged-up-stopped": forged_up_then_stopped,
    "stopped-after-publish": stopped_after_publish,
    "rank0-killed-in-init": rank0_killed_in_init,
    "killed-in-init-torchrun": killed_in_init_torchrun,
    "silent-master-port": silent_master_port,
}
