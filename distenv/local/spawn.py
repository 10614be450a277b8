"""`launch`: run a function on N local ranks, each in a process group, and collect what it returns.

The in-Python counterpart of ``distenv run``, replacing detectron2's ``launch`` and
``torch.multiprocessing.spawn`` boilerplate::

    def train(lr):
        ...
        return metrics

    results = distenv.launch(train, nprocs=4, args=(0.1,))   # one result per rank

    @distenv.launch(nprocs=4)
    def evaluate(path): ...
    evaluate("ckpt.pt")                                       # runs on 4 ranks

Workers start with the ``spawn`` method, get torchrun's environment contract and join a process
group through `distenv.bootstrap.init.init_dist` before the function runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, ParamSpec, TypeVar, overload

from distenv.errors import ConfigurationError, WorkerFailedError, quoted
from distenv.exits import one_line
from distenv.local.cpus import thread_env
from distenv.local.plan import (
    LaunchOptions,
    child_env,
    is_stale,
    local_ranks,
    plan_node,
)
from distenv.local.stopping import DEFAULT_GRACE_PERIOD, StopPolicy, describe_exit
from distenv.settings import MAX_SECONDS, Settings, seconds
from distenv.system.processes import parent_death_signal
from distenv.variables import MAX_COUNT

__all__ = ["Launched", "launch"]

P = ParamSpec("P")
R = TypeVar("R")

#: The source named in `launch`'s errors and in the plan it makes.
SOURCE = "launch"
POLL_INTERVAL = 0.1
PICKLE_HINT = (
    "spawned workers import the function by name: use a module-level function (not a lambda, "
    "closure or method of a local class) and picklable arguments"
)


@dataclass(frozen=True)
class _Options:
    nprocs: int
    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None
    backend: str | None
    timeout: Any
    grace_period: float
    run_id: str | None


@dataclass(frozen=True)
class _Ref:
    """A decorated function, by name: pickle cannot send it, its module name means the wrapper."""

    module: str
    qualname: str

    def load(self) -> Callable[..., Any]:
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj.fn if isinstance(obj, Launched) else obj


class Launched(Generic[P, R]):
    """A function that runs on every rank when called; what ``@distenv.launch(nprocs=N)`` returns.

    Calling it returns the list of per-rank return values, in rank order. The undecorated function
    is `fn` (and ``__wrapped__``).
    """

    def __init__(self, fn: Callable[P, R], options: _Options) -> None:
        self.fn = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        return _run(self, self.options, args, kwargs)


class _Decorator:
    """What ``distenv.launch(nprocs=N)`` returns: turns a function into a `Launched` one."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def __call__(self, fn: Callable[P, R]) -> Launched[P, R]:
        return Launched(fn, self.options)


def _payload(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    target: Any = fn
    if isinstance(fn, Launched):
        target = _Ref(fn.fn.__module__, fn.fn.__qualname__)
    try:
        return pickle.dumps((target, tuple(args), dict(kwargs)))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigurationError(
            SOURCE, f"cannot send {fn!r} and its arguments to the workers: {exc}", hint=PICKLE_HINT
        ) from exc


def _worker(
    conn: Connection,
    env: dict[str, str],
    payload: bytes,
    backend: str | None,
    timeout: Any,
    parent: int,
) -> None:
    """Run in each spawned worker: join the group, call the function, send back its result."""
    # multiprocessing starts the workers, so no exec wrapper can ask for the parent-death signal.
    if not parent_death_signal(parent):
        os.kill(os.getpid(), signal.SIGKILL)
    for key in [key for key in os.environ if is_stale(key)]:
        del os.environ[key]
    os.environ.update(env)
    try:
        # After the env is set: unpickling imports the function's module, which may read it.
        # The payload is our own parent's, through a pipe only it holds.
        target, args, kwargs = pickle.loads(payload)  # noqa: S301
        fn = target.load() if isinstance(target, _Ref) else target
        from distenv.bootstrap.init import init_dist

        init_dist(launcher="pytorch", backend=backend, timeout=timeout)
        import torch
        import torch.distributed as dist

        threads = Settings.read(env).omp_num_threads or ""
        if threads.isdigit() and int(threads) > 0:
            # torch may have read the inherited value when the main module was re-imported.
            torch.set_num_threads(int(threads))
        try:
            result = fn(*args, **kwargs)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        data = pickle.dumps(("ok", result))
    except BaseException as exc:  # every failure, even SystemExit, must reach the parent
        summary = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        with contextlib.suppress(OSError):
            conn.send(("error", summary, traceback.format_exc()))
        conn.close()
        raise SystemExit(1) from None
    conn.send_bytes(data)
    conn.close()


def _check(options: _Options) -> None:
    for name in ("nprocs", "nnodes"):
        value = getattr(options, name)
        if type(value) is not int or not 1 <= value <= MAX_COUNT:
            raise ConfigurationError(
                SOURCE,
                f"{name}={quoted(value)}, expected an int in [1, {MAX_COUNT}]",
                hint=f"pass {name} as a whole number of processes/nodes, e.g. {name}=2",
            )
    if type(options.node_rank) is not int or not 0 <= options.node_rank < options.nnodes:
        raise ConfigurationError(
            SOURCE,
            f"node_rank={quoted(options.node_rank)} is outside [0, nnodes={options.nnodes})",
            hint="number the nodes 0 to nnodes-1",
        )
    grace = options.grace_period
    if type(grace) not in (int, float) or not 0 <= grace <= MAX_SECONDS:  # the joins overflow
        raise ConfigurationError(
            SOURCE,
            f"grace_period={quoted(grace)} is not a number of seconds in [0, {MAX_SECONDS:.0f}]",
            hint="pass the seconds between SIGTERM and SIGKILL, e.g. grace_period=30",
        )
    if options.timeout is not None:  # here once, not in every worker
        seconds(options.timeout, "timeout")


def _run(
    fn: Callable[..., Any], options: _Options, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[Any]:
    _check(options)
    payload = _payload(fn, args, kwargs)
    plan = plan_node(
        LaunchOptions(
            who=SOURCE,
            nnodes=options.nnodes,
            node_rank=options.node_rank,
            master_addr=options.master_addr,
            master_port=options.master_port,
            option="master_addr",
            hint="pass master_addr (the host of node 0) on every node",
            run_id=options.run_id,
            run_id_option="run_id",
        ),
        None,  # launch() takes the nodes from its arguments, never from a scheduler
    )
    nprocs = options.nprocs
    extra = thread_env(SOURCE, nprocs, Settings.read(os.environ))
    policy = StopPolicy(options.grace_period)
    context = multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = []
    pending: dict[Connection, int] = {}
    results: dict[int, Any] = {}
    try:
        for local_rank, info in enumerate(local_ranks(SOURCE, plan, nprocs)):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker,
                args=(
                    sender,
                    child_env({}, info, plan, extra),
                    payload,
                    options.backend,
                    options.timeout,
                    os.getpid(),
                ),
                name=f"distenv-rank{info.rank}",
            )
            process.start()
            sender.close()  # so that a dead worker's pipe reads as EOF here
            processes.append(process)
            pending[receiver] = local_rank
        while pending:
            # Read results as they come: a worker blocks in send() until its (possibly large)
            # result is read, so joining first would deadlock.
            by_sentinel = {processes[i].sentinel: conn for conn, i in pending.items()}
            for item in wait([*pending, *by_sentinel], timeout=POLL_INTERVAL):
                conn = by_sentinel[item] if isinstance(item, int) else item
                if not isinstance(conn, Connection) or conn not in pending:
                    continue  # both its pipe and its sentinel were ready: read already
                local_rank = pending.pop(conn)
                message = None
                # Nothing to read from an exited worker: it died before sending (a grandchild
                # may still hold the pipe open, so recv() could block).
                with contextlib.suppress(EOFError, OSError):
                    if conn.poll():
                        message = conn.recv()
                conn.close()
                if message is not None and message[0] == "ok":
                    results[local_rank] = message[1]
                else:
                    _fail(processes, local_rank, message, options, policy)
        for worker in processes:
            worker.join(timeout=options.grace_period)
    finally:
        policy.stop(processes)
        for conn in pending:
            conn.close()
    return [results[i] for i in range(nprocs)]


def _fail(
    processes: Sequence[BaseProcess],
    local_rank: int,
    message: Any,
    options: _Options,
    policy: StopPolicy,
) -> None:
    """Stop every worker and raise for the one at `local_rank`, which failed."""
    process = processes[local_rank]
    rank = options.node_rank * options.nprocs + local_rank
    others = policy.stop([p for p in processes if p is not process])
    process.join(timeout=options.grace_period)  # it exits by itself after reporting
    policy.stop([process])
    if message is None:  # died without a word (a signal, os._exit, a crash in C)
        code = process.exitcode
        how = "did not exit" if code is None else describe_exit(code)
        raise WorkerFailedError(
            SOURCE,
            rank,
            policy.failure(rank, process.pid, f"{how} without a result", others),
            exitcode=code,
        )
    raise WorkerFailedError(
        SOURCE,
        rank,
        policy.failure(rank, process.pid, f"raised {message[1]}", others),
        traceback=message[2],
        exitcode=process.exitcode,
    )


@overload
def launch(
    fn: Callable[P, R],
    nprocs: int,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    backend: str | None = None,
    timeout: Any = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
) -> list[R]: ...


@overload
def launch(
    fn: None = None,
    *,
    nprocs: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    backend: str | None = None,
    timeout: Any = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
) -> _Decorator: ...


@one_line
def launch(
    fn: Callable[..., Any] | None = None,
    nprocs: int | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    backend: str | None = None,
    timeout: Any = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
) -> list[Any] | _Decorator:
    """Run `fn` on `nprocs` local ranks, each in the process group, and return their results.

    Each worker is a fresh interpreter (``spawn``) with torchrun's environment contract; it calls
    ``distenv.bootstrap.init.init_dist(launcher="pytorch", backend=backend, timeout=timeout)``, then
    ``fn(*args, **kwargs)``, then destroys the group. The first worker that raises or dies makes
    the others receive SIGTERM, then SIGKILL after `grace_period` seconds. Without `fn`, returns a
    decorator: ``@distenv.launch(nprocs=4)`` makes calling the function run it on 4 ranks.

    Args:
        fn: A module-level function (the workers import it by name); None for the decorator form.
        nprocs: Ranks on this node.
        args: Positional arguments for `fn` (picklable).
        kwargs: Keyword arguments for `fn` (picklable).
        nnodes: Number of nodes, each calling `launch` with its own `node_rank`.
        node_rank: This node's index; its ranks are ``node_rank * nprocs + local_rank``.
        master_addr: Rank 0's host; 127.0.0.1 on one node, required on several.
        master_port: Rank 0's store port; a free port on one node, else 29500.
        backend: The process-group backend (default: nccl with GPUs, else gloo).
        timeout: The process group's timeout (seconds or a timedelta); torch's default if None.
        grace_period: Seconds between SIGTERM and SIGKILL when stopping workers.
        run_id: The run's identity, the same on every node: required for several nodes (on one
            node a random one is drawn). Ranks of another run that reach this run's store are
            refused.

    Returns:
        The return values of this node's ranks, in rank order; or the decorator.

    Raises:
        WorkerFailedError: If a worker raised (its traceback included) or died.
        ConfigurationError: If an argument is invalid or `fn` and its arguments cannot be pickled.
    """
    if nprocs is None:
        raise ConfigurationError(SOURCE, "nprocs is missing", hint="e.g. launch(fn, nprocs=4)")
    options = _Options(
        nprocs, nnodes, node_rank, master_addr, master_port, backend, timeout, grace_period, run_id
    )
    _check(options)
    if fn is None:
        return _Decorator(options)
    return _run(fn, options, args, kwargs or {})
