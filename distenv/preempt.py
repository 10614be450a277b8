"""Preemption: hear the scheduler's warning signal, agree on it at a step boundary, requeue the job.

Nothing here runs on import. `watch_preemption` installs a handler for the warning signal that
only notes its arrival; `stop_requested`, called by every rank at the same step boundary, reduces
the ranks' notes (MAX over the default process group, overlapped with the next step), so every
rank stops at the same step even when the signal reached only some of them. `requeue` then puts the job back in the queue: every
rank enters a barrier after writing its checkpoint, rank 0 runs the scheduler's command once, and
the scheduler ends the run. docs/preemption.md has the recipes per scheduler.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from distenv.comm import barrier, get_dist_info
from distenv.errors import ConfigurationError, RequeueError, warn
from distenv.exits import one_line
from distenv.launchers import Scheduler
from distenv.launchers.registry import auto_candidates

if TYPE_CHECKING:
    import torch

__all__ = [
    "WARNING_SIGNALS",
    "Preemption",
    "requeue",
    "requeue_command",
    "stop_requested",
    "watch_preemption",
]

#: The signals a scheduler may send as a warning (sbatch --signal, LSF's bkill -s / JOB_WARNING).
WARNING_SIGNALS = {"USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2, "TERM": signal.SIGTERM}

#: Seconds `requeue` waits for the scheduler's command, then for the scheduler to end the run.
DEFAULT_REQUEUE_TIMEOUT = 60.0


def _signal(value: str | int) -> signal.Signals:
    """Return the warning signal named by `value` (``"USR1"``, ``"SIGUSR1"``, or its number)."""
    if isinstance(value, int):
        found = next((s for s in WARNING_SIGNALS.values() if s == value), None)
    else:
        found = WARNING_SIGNALS.get(value.strip().upper().removeprefix("SIG"))
    if found is None:
        raise ConfigurationError(
            "preempt",
            f"{value!r} is not a warning signal distenv handles",
            hint="use USR1, USR2 or TERM (the SIG in sbatch's --signal=[B:]SIG@SECONDS)",
            value=str(value),
        )
    return found


class Preemption:
    """An installed watch for warning signals, and the per-step agreement over the process group.

    Attributes:
        signals: The warning signals handled.
        every: `stop_requested` asks the group on every `every`-th call only (all ranks call it
            equally often, so they ask at the same calls); in between it answers from the last
            agreement.
        received: The first warning signal this process received, or None.
        requested: Whether the group has agreed that a stop was requested (sticky).
    """

    def __init__(self, signals: tuple[signal.Signals, ...], every: int) -> None:
        self.signals = signals
        self.every = every
        self.received: signal.Signals | None = None
        self.requested = False
        self._calls = 0
        self._previous: dict[signal.Signals, object] = {}
        self._pending: tuple[Any, torch.Tensor] | None = None  # (torch's Work, its tensor)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A Python handler runs between bytecodes of the main thread: a collective in flight
        # finishes first, and the flag is read at the next step boundary.
        if self.received is None:
            self.received = signal.Signals(signum)

    def install(self) -> None:
        """Install the handler for `signals` (remembering what was there).

        Raises:
            ConfigurationError: Outside the main thread, where Python cannot install handlers.
        """
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError(
                "preempt",
                f"watch_preemption() was called in thread {threading.current_thread().name!r}",
                hint="call it in the main thread (Python runs signal handlers there only)",
            )
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        """Restore the handlers that were installed before."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def stop_requested(self) -> bool:
        """Return whether any rank received a warning signal (a collective: call on every rank)."""
        if self.requested:
            return True
        self._calls += 1
        if self._calls % self.every:
            return False
        local = self.received is not None
        if get_dist_info()[1] > 1:
            local = self._agree(local)
        self.requested = local
        return local

    def _agree(self, local: bool) -> bool:
        """Return the group's answer to the previous ask; start this ask's all-reduce.

        Asynchronous, so that the all-reduce overlaps the next step instead of adding its latency
        to this one: every rank reads the result of the same collective at the same call, so the
        answer still agrees, one ask later.
        """
        import torch
        import torch.distributed as dist

        agreed = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            agreed = bool(flag.item())
        if not agreed:
            on_gpu = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
            flag = torch.full((1,), int(local), dtype=torch.int32, device=device)
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            self._pending = (work, flag)
        else:
            self._pending = None
        return agreed


_watch: Preemption | None = None


@one_line
def watch_preemption(signals: Iterable[str | int] = ("USR1",), *, every: int = 1) -> Preemption:
    """Install a handler for the scheduler's warning signals; call it once, before training.

    The handler only notes the signal; the training loop calls `stop_requested` at each step
    boundary. Calling it again replaces the earlier watch.

    Args:
        signals: Warning signals: ``USR1``, ``USR2`` or ``TERM`` (as in sbatch's
            ``--signal=USR1@120``), by name or number.
        every: Ask the process group on every `every`-th `stop_requested` call only.

    Raises:
        ConfigurationError: On a signal other than those, `every` below 1, or outside the main
            thread.
    """
    global _watch
    chosen = tuple(dict.fromkeys(_signal(s) for s in signals))
    if not chosen or every < 1:
        raise ConfigurationError(
            "preempt",
            f"watch_preemption(signals={list(signals)!r}, every={every!r}) watches nothing",
            hint="name at least one of USR1, USR2, TERM and an every of 1 or more",
        )
    watch = Preemption(chosen, every)
    if _watch is not None:
        _watch.uninstall()
        _watch = None
    watch.install()
    _watch = watch
    return watch


def stop_requested() -> bool:
    """Return whether a warning signal reached any rank: call it on every rank at each step.

    A collective over the default process group: one 4-byte all-reduce, started without waiting
    and read at the next ask, so a warning is seen one ask after it arrived, at the same step on
    every rank (without a group: this process's own flag, at once). Once true it stays true.

    Raises:
        ConfigurationError: If `watch_preemption` was not called first.
    """
    if _watch is None:
        raise ConfigurationError(
            "preempt",
            "stop_requested() was called but no warning signal is watched",
            hint="call distenv.watch_preemption() once before the training loop",
        )
    return _watch.stop_requested()


def requeue_command(env: Mapping[str, str]) -> list[str]:
    """Return the argument list that requeues this job (the innermost scheduler's).

    Raises:
        RequeueError: Outside a scheduler that can requeue (Slurm, LSF, a plug-in that says how).
    """
    for candidate in auto_candidates(env):
        if isinstance(candidate, Scheduler) and candidate.detect(env):
            command = candidate.requeue_command(env)
            if command:
                return command
    raise RequeueError(
        "requeue",
        "this process is in no scheduler job that can be requeued ($SLURM_JOB_ID and $LSB_JOBID "
        "are unset)",
        hint="requeue works under sbatch and bsub; elsewhere save the checkpoint, exit, and "
        "restart the run yourself (distenv run --max-restarts restarts it in place after a failure)",
    )


def _run(command: list[str], timeout: float) -> str | None:
    """Run `command` (no shell); return None on success, else what went wrong."""
    shown = shlex.join(command)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{shown}` failed: {exc}"
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip() or "(no output)"
        return f"`{shown}` exited with status {done.returncode}: {output}"
    return None


def _from_rank0(failure: str | None) -> str | None:
    import torch.distributed as dist

    box: list[str | None] = [failure]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@one_line
def requeue(*, timeout: float = DEFAULT_REQUEUE_TIMEOUT) -> NoReturn:
    """Put this job back in the queue and end the run; call it on every rank after checkpointing.

    Every rank enters a barrier (so every checkpoint is written before anything is killed), then
    rank 0 alone runs the scheduler's command (Slurm: ``scontrol requeue`` with the job's id, or
    an array element's ``ARRAYID_INDEX``; LSF: ``brequeue``) and the scheduler ends the run; the
    job starts again later with `RankInfo.restart_count` above 0. It never returns.

    Args:
        timeout: Seconds allowed for the command, and then for the scheduler to end the run.

    Raises:
        RequeueError: Outside Slurm/LSF (on every rank, before the barrier); if the command
            fails (on every rank, naming the command and its output); or if the scheduler has
            not ended the run `timeout` seconds after it accepted the requeue.
    """
    command = requeue_command(os.environ)
    rank, world = get_dist_info()
    barrier()
    if rank == 0:
        # Said before, not after: the scheduler may end this run before the command returns.
        warn("requeue: running `%s`", shlex.join(command))
    failure = _run(command, timeout) if rank == 0 else None
    if world > 1:
        failure = _from_rank0(failure)
    if failure is not None:
        raise RequeueError("requeue", failure, hint="check the job id and that it may be requeued")
    if _watch is not None:
        _watch.uninstall()  # the scheduler's SIGTERM must end this process, not set a flag
    if rank == 0:
        warn("requeue: `%s` accepted; waiting for the scheduler to end this run", command[0])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RequeueError(
        "requeue",
        f"`{shlex.join(command)}` succeeded but the job still runs {timeout:g}s later",
        hint="check with `scontrol show job` (or bjobs) that the job went back to the queue",
    )
