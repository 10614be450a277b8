"""`init_dist` and `setup`: from this process's launcher to a torch process group.

Both run the same steps, in this order, and are the only functions of distenv that change the
process (os.environ, the multiprocessing start method, the current CUDA device):

1. detect and resolve the `RankInfo` (`distenv.detect.explain`, `distenv.resolve.resolve`);
2. set the multiprocessing start method (``spawn`` unless one is set already);
3. select and set this rank's CUDA device, before any process group exists;
4. export torchrun's ``env://`` contract into os.environ, tagged with ``DISTENV_SCOPE`` so that
   later detection recognises distenv's own exports (see `distenv._master`);

and `init_dist` goes on to

5. connect to rank 0's TCPStore within the rendezvous timeout, hold the roll call over it
   (`distenv.rollcall`: every rank checks in, rank 0 validates and names missing ranks), and call
   ``torch.distributed.init_process_group`` with the same store;
6. log one summary line on rank 0 (logger ``distenv``, INFO);
7. seed every generator, if asked.

torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from distenv._master import SCOPE_VAR
from distenv.detect import Detection
from distenv.device import choose_backend, device_identity, select_device, visible_device_count
from distenv.errors import (
    ConfigurationError,
    DistEnvError,
    InitError,
    MasterResolutionError,
    RendezvousTimeoutError,
)
from distenv.rankinfo import RankInfo
from distenv.resolve import detect_resolved
from distenv.rollcall import CheckIn, interruptible, roll_call

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "TIMEOUT_VAR",
    "connect_store",
    "current_device",
    "current_info",
    "gpu_sharing_allowed",
    "host_port",
    "init_dist",
    "rendezvous_seconds",
    "setup",
    "tcp_url",
]

logger = logging.getLogger("distenv")

#: Seconds every rank may take to reach rank 0's store, when neither the argument nor
#: ``DISTENV_TIMEOUT`` says otherwise (TCPStore's own default).
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0
TIMEOUT_VAR = "DISTENV_TIMEOUT"
# torchrun's agent hosts the store on MASTER_PORT itself when this is "True" (torch compares it to
# str(True): torch/distributed/rendezvous.py, _create_c10d_store); workers then only connect.
AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_VAR = "TORCHELASTIC_RESTART_COUNT"
STORE_PREFIX = "distenv/pg"
ROLLCALL_PREFIX = "distenv/rollcall"

Timeout = float | datetime.timedelta


@dataclasses.dataclass(frozen=True)
class _State:
    """What the last `setup` or `init_dist` of this process decided."""

    info: RankInfo
    scope: str
    device: int | None
    allow_gpu_sharing: bool


_state: _State | None = None


def current_info() -> RankInfo | None:
    """Return the `RankInfo` the last `init_dist` or `setup` of this process used, if any."""
    return None if _state is None else _state.info


def current_device() -> int | None:
    """Return the CUDA device index `init_dist`/`setup` selected for this rank (None: CPU)."""
    return None if _state is None else _state.device


def gpu_sharing_allowed() -> bool:
    """Return the ``allow_gpu_sharing`` given to the last `init_dist`/`setup` (False if none)."""
    return _state is not None and _state.allow_gpu_sharing


def host_port(host: str, port: int) -> str:
    """Return ``host:port``, with an IPv6 address in brackets (``[fe80::1]:29500``)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def tcp_url(host: str, port: int) -> str:
    """Return the ``tcp://`` URL of a store (``tcp://[::1]:29500`` for IPv6)."""
    return f"tcp://{host_port(host, port)}"


def _master_address(info: RankInfo) -> str:
    return host_port(str(info.master_addr), int(info.master_port or 0))


def _seconds(value: object, name: str) -> float:
    """Return `value` (seconds or a timedelta) as positive finite seconds, or raise naming it."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            "init",
            f"{name}={value!r} is invalid, expected a positive number of seconds",
            hint=f"pass {name} as seconds (e.g. 600) or a datetime.timedelta",
        )
    return seconds


def rendezvous_seconds(
    rendezvous_timeout: Timeout | None, default: float = DEFAULT_RENDEZVOUS_TIMEOUT
) -> float:
    """Return the rendezvous timeout: the argument, else ``$DISTENV_TIMEOUT``, else `default`."""
    if rendezvous_timeout is not None:
        return _seconds(rendezvous_timeout, "rendezvous_timeout")
    text = os.environ.get(TIMEOUT_VAR)
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            "init",
            f"${TIMEOUT_VAR} is {text!r}, expected a positive number of seconds",
            hint=f"export {TIMEOUT_VAR}=600, or unset it for {default:g} s",
            variable=TIMEOUT_VAR,
            value=text,
        )
    return seconds


def _check_start_method(start_method: str | None) -> None:
    import multiprocessing  # here: it costs milliseconds that `import distenv` should not pay

    if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
        raise ConfigurationError(
            "init",
            f"start_method={start_method!r} is not available here",
            hint=f"use one of {', '.join(multiprocessing.get_all_start_methods())}, or None",
        )


def _apply_start_method(start_method: str | None) -> None:
    """Set the default start method unless the program chose one already.

    DataLoader workers (``num_workers > 0``) use this default. Under ``spawn`` they start clean
    interpreters: no copy of a CUDA context or of the process group's threads (``fork`` after
    either can deadlock), at the price of a slower start, a dataset that must pickle, and a main
    module that must be guarded by ``if __name__ == "__main__":``.
    """
    if start_method is None:
        return
    import multiprocessing

    current = multiprocessing.get_start_method(allow_none=True)
    if current is None:
        multiprocessing.set_start_method(start_method)
    elif current != start_method:
        logger.debug("keeping multiprocessing start method %r (set before distenv)", current)


def _same_job(a: RankInfo, b: RankInfo) -> bool:
    """Whether two answers describe the same rank (the master port may differ: `none` picks anew)."""
    ignore = ("master_addr", "master_port")
    return {k: v for k, v in a.to_dict().items() if k not in ignore} == {
        k: v for k, v in b.to_dict().items() if k not in ignore
    }


def _resolve(launcher: str, master_addr_format: str | None) -> tuple[Detection, RankInfo]:
    detection, info = detect_resolved(launcher, master_addr_format=master_addr_format)
    if _state is not None and _same_job(_state.info, info):
        # A second call keeps the first answer, so MASTER_PORT (a fresh free port for `none`)
        # does not change under a group that already uses it.
        info = _state.info
    return detection, info


def _prepare(
    detection: Detection,
    info: RankInfo,
    *,
    start_method: str | None,
    set_device: bool,
    allow_gpu_sharing: bool,
) -> int | None:
    """Run the steps `setup` and `init_dist` share; return the selected CUDA device index."""
    global _state
    _apply_start_method(start_method)
    device = select_device(info.local_rank, info.local_world_size, visible_device_count())
    if set_device and device is not None:
        import torch

        # Before init_process_group: NCCL binds its communicator to the current device, and a
        # rank left on cuda:0 puts its context (and, before device_id existed, its
        # communicator) on another rank's GPU.
        torch.cuda.set_device(device)
    os.environ.update(info.to_env())
    os.environ[SCOPE_VAR] = detection.scope
    _state = _State(info, detection.scope, device, allow_gpu_sharing)
    return device


def setup(
    launcher: str = "auto",
    *,
    start_method: str | None = "spawn",
    set_device: bool = True,
    allow_gpu_sharing: bool = False,
    master_addr_format: str | None = None,
) -> RankInfo:
    """Prepare this process for a framework that creates the process group itself.

    Does everything `init_dist` does except the process group: resolves the `RankInfo`, sets the
    multiprocessing start method, selects and sets the CUDA device, and exports torchrun's
    contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and DISTENV_SCOPE) into os.environ,
    which Lightning, HF accelerate and DeepSpeed read. Call it before they start.

    Args:
        launcher: ``auto`` or a launcher name (see `distenv.detect.explain`).
        start_method: The multiprocessing start method to set when none is set yet (DataLoader
            workers use it); None leaves it alone.
        set_device: Whether to call ``torch.cuda.set_device`` with the selected device.
        allow_gpu_sharing: Whether ranks may share a physical GPU; stored for the cross-rank
            check (`gpu_sharing_allowed`).
        master_addr_format: Maps the launcher's default master host to the address to use,
            e.g. ``"{host}-ib"`` (overrides ``$DISTENV_MASTER_ADDR_FORMAT``; explicit
            MASTER_ADDR still wins).

    Returns:
        This rank's resolved `RankInfo`.

    Raises:
        DistEnvError: If detection or resolution fails, or an argument is invalid.
    """
    _check_start_method(start_method)
    detection, info = _resolve(launcher, master_addr_format)
    _prepare(
        detection,
        info,
        start_method=start_method,
        set_device=set_device,
        allow_gpu_sharing=allow_gpu_sharing,
    )
    return info


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_resolvable(info: RankInfo, host: str, port: int) -> None:
    """Raise at once, naming MASTER_ADDR, when the master's name does not resolve here."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise MasterResolutionError(
            info.launcher,
            f"rank {info.rank} cannot resolve the master address {host!r} "
            f"($MASTER_ADDR={host!r}): {exc.strerror}",
            hint="use a name every node resolves (or its IP address); on clusters whose fast "
            "network has other names, set DISTENV_MASTER_ADDR_FORMAT, e.g. '{host}-ib'",
            variable="MASTER_ADDR",
            value=host,
        ) from None


def _wait_reachable(info: RankInfo, host: str, port: int, deadline: float, limit: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; raise at `deadline`.

    Probing with a plain socket first keeps torch's C++ retry logs and stack dumps out of the
    user's first message, and bounds the wait exactly.
    """
    # Start at 1 ms: rank 0 usually listens within milliseconds of the others' first probe, and
    # a 50 ms first pause cost every srun bootstrap ~100 ms (docs/benchmarks.md).
    delay, last = 0.001, ""
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(remaining, 5.0), 0.1)):
                return
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousTimeoutError(
                info.launcher,
                f"rank {info.rank} of {info.world_size} could not reach rank 0's store at "
                f"{host_port(host, port)} within {limit:g} s (last error: {last})",
                hint="check that rank 0 is running and that MASTER_ADDR/MASTER_PORT name a host "
                "and port this node can reach (a firewall, or DISTENV_MASTER_ADDR_FORMAT for the "
                f"right interface); raise the limit with rendezvous_timeout= or ${TIMEOUT_VAR}",
                variable="MASTER_ADDR",
                value=host,
            )
        # Back off: rank 0 may still be importing torch.
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 1.0)


def connect_store(info: RankInfo, seconds: float, *, agent_store: bool) -> Store:
    """Create (rank 0) or reach (others) the TCPStore at the master within `seconds`.

    Under torchrun's agent store (`agent_store`) every rank, rank 0 included, is a client.
    """
    import torch.distributed as dist

    # The classes' home; torch.distributed re-exports them without declaring it to type checkers.
    from torch._C._distributed_c10d import TCPStore

    host, port = str(info.master_addr), int(info.master_port or 0)
    _check_resolvable(info, host, port)
    timeout = datetime.timedelta(seconds=seconds)
    if info.rank == 0 and not agent_store:
        try:
            return TCPStore(
                host, port, info.world_size, is_master=True, timeout=timeout, wait_for_workers=False
            )
        except dist.DistError as exc:
            text = str(exc)
            if "EADDRINUSE" in text or "address already in use" in text.lower():
                raise DistEnvError(
                    info.launcher,
                    f"rank 0 cannot listen on port {port} ($MASTER_PORT={port!r}) for the "
                    "store: the port is already in use",
                    hint="another process on this node holds it; export MASTER_PORT=<another "
                    "port>, or unset it where the launcher derives one",
                    variable="MASTER_PORT",
                    value=str(port),
                ) from None
            raise InitError(
                info.launcher,
                f"rank 0 cannot start the store on {host_port(host, port)}: {_first_line(exc)}",
                hint="check MASTER_ADDR names this host and MASTER_PORT is a usable port",
            ) from None
    deadline = time.monotonic() + seconds
    _wait_reachable(info, host, port, deadline, seconds)
    remaining = max(deadline - time.monotonic(), 1.0)
    try:
        return TCPStore(
            host,
            port,
            info.world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=remaining),
        )
    except dist.DistError as exc:
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} reached {host_port(host, port)} but could not "
            f"join its store within {seconds:g} s: {_first_line(exc)}",
            hint="is another job's store on that port? give each job its own MASTER_PORT",
            variable="MASTER_PORT",
            value=str(port),
        ) from None


def make_checkin(info: RankInfo, backend: str, device: int | None) -> CheckIn:
    """Return what this rank reports in the roll call."""
    import torch

    return CheckIn(
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        node_rank=info.node_rank,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        launcher=info.launcher,
        master=_master_address(info),
        backend=backend,
        torch_version=str(torch.__version__),
        device=None if device is None else device_identity(device),
        allow_gpu_sharing=gpu_sharing_allowed(),
    )


def _init_process_group(
    info: RankInfo,
    backend: str,
    device: int | None,
    timeout: float | None,
    rendezvous_s: float,
) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore

    agent_store = os.environ.get(AGENT_STORE_VAR) == str(True)
    with interruptible("the connection to rank 0's store"):
        store = connect_store(info, rendezvous_s, agent_store=agent_store)
    # torchrun's agent store outlives a worker restart; keys of one attempt must not be read by
    # the next (torch prefixes "/worker/attempt_N" for the same reason).
    attempt = os.environ.get(RESTART_VAR) or "0"
    prefix = f"{STORE_PREFIX}/{attempt}"
    # Everybody checks in before torch is asked to wait: a missing rank is named, not waited for.
    roll_call(
        PrefixStore(f"{ROLLCALL_PREFIX}/{attempt}", store),
        info,
        make_checkin(info, backend, device),
        timeout=rendezvous_s,
    )
    options: dict[str, Any] = {}
    if device is not None and "nccl" in backend.lower():
        # Binds the communicator to this device and lets NCCL connect eagerly (torch >= 2.3).
        options["device_id"] = torch.device("cuda", device)
    pg_timeout = None if timeout is None else datetime.timedelta(seconds=timeout)
    where = f"rank {info.rank} of {info.world_size} (store {_master_address(info)})"
    try:
        dist.init_process_group(
            backend=backend,
            store=PrefixStore(prefix, store),
            rank=info.rank,
            world_size=info.world_size,
            timeout=pg_timeout,
            **options,
        )
    except dist.DistStoreError as exc:
        raise RendezvousTimeoutError(
            info.launcher,
            f"{where}: not every rank checked in: {_first_line(exc)}",
            hint="a rank did not start or crashed before init_dist; check every rank's log",
        ) from None
    except (RuntimeError, ValueError) as exc:  # DistError is a RuntimeError
        raise InitError(
            info.launcher,
            f"{where}: init_process_group(backend={backend!r}) failed: {_first_line(exc)}",
            hint="check that the backend is available in this torch build (nccl needs CUDA)",
        ) from None
    # From here on the store serves new_group and barriers: give it the group's patience, not the
    # check-in limit.
    store.set_timeout(pg_timeout or dist.default_pg_timeout)


def _reuse(info: RankInfo) -> RankInfo:
    """Return the RankInfo of the group that exists, or raise if it is another world."""
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    if (rank, size) != (info.rank, info.world_size):
        raise InitError(
            info.launcher,
            f"torch.distributed is already initialised as rank {rank} of {size}, but the "
            f"launcher says rank {info.rank} of {info.world_size}",
            hint="call init_dist once, before anything else creates the default process group "
            "(or call torch.distributed.destroy_process_group() first)",
        )
    return info


def init_dist(
    launcher: str = "auto",
    backend: str | None = None,
    *,
    timeout: Timeout | None = None,
    rendezvous_timeout: Timeout | None = None,
    start_method: str | None = "spawn",
    set_device: bool = True,
    allow_gpu_sharing: bool = False,
    seed: int | None = None,
    master_addr_format: str | None = None,
) -> RankInfo:
    """Initialise torch.distributed for this process, whatever launcher started it.

    Runs `setup`'s steps (resolve, start method, CUDA device, export of torchrun's contract),
    then creates the default process group over a TCPStore on ``MASTER_ADDR:MASTER_PORT``, logs
    one summary line on rank 0 (logger ``distenv``, INFO: configure logging, e.g. with
    `distenv.get_logger`, to see it), and seeds the generators if `seed` is given. With no
    launcher (``none``) it makes a 1-rank group on 127.0.0.1 and a free port.

    Calling it again for the same rank and world returns the same `RankInfo` and creates nothing.

    Args:
        launcher: ``auto`` or a launcher name (see `distenv.detect.explain`).
        backend: The process-group backend; by default ``nccl`` when CUDA is usable and this rank
            has a device, else ``gloo``. Any torch spelling wins as given
            (``"cpu:gloo,cuda:nccl"``, ``"mpi"``).
        timeout: torch's process-group timeout (seconds or a timedelta); torch's default if None.
        rendezvous_timeout: How long a rank may take to reach rank 0's store (seconds or a
            timedelta); default ``$DISTENV_TIMEOUT``, else 300 s.
        start_method: The multiprocessing start method to set when none is set yet; DataLoader
            workers use it (``spawn``: clean workers that need a picklable dataset and a
            ``__main__`` guard). None leaves it alone.
        set_device: Whether to call ``torch.cuda.set_device`` (before the group exists) and pass
            ``device_id`` to init_process_group.
        allow_gpu_sharing: Whether ranks may share a physical GPU; stored for the cross-rank
            check (`gpu_sharing_allowed`).
        seed: If given, `distenv.seed_everything` (seed) after the group exists.
        master_addr_format: Maps the launcher's default master host to the address to use,
            e.g. ``"{host}-ib"`` (overrides ``$DISTENV_MASTER_ADDR_FORMAT``; explicit
            MASTER_ADDR still wins).

    Returns:
        This rank's resolved `RankInfo`.

    Raises:
        ConfigurationError: If an argument or DISTENV_TIMEOUT is invalid.
        RendezvousTimeoutError: If this rank cannot reach rank 0's store within the rendezvous
            timeout, or not every rank checks in.
        InitError: If torch.distributed is already initialised for another world, or torch
            refuses the group.
        DistEnvError: If detection or resolution fails, or rank 0's port is taken.
    """
    pg_seconds = None if timeout is None else _seconds(timeout, "timeout")
    rendezvous_s = rendezvous_seconds(rendezvous_timeout)
    _check_start_method(start_method)
    if backend is not None:
        choose_backend(cuda_available=False, has_device=False, explicit=backend)
    if seed is not None:
        from distenv.seeding import check_seed

        check_seed(seed)

    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise InitError(
            "init",
            "this torch build has no torch.distributed",
            hint="install a torch wheel from pytorch.org (every official build includes it)",
        )
    detection, info = _resolve(launcher, master_addr_format)
    if dist.is_initialized():
        return _reuse(info)
    device = _prepare(
        detection,
        info,
        start_method=start_method,
        set_device=set_device,
        allow_gpu_sharing=allow_gpu_sharing,
    )
    chosen = choose_backend(
        cuda_available=torch.cuda.is_available(), has_device=device is not None, explicit=backend
    )
    _init_process_group(info, chosen, device if set_device else None, pg_seconds, rendezvous_s)
    if info.rank == 0:
        logger.info(
            "init_dist: launcher=%s world_size=%d nodes=%d master=%s backend=%s device=%s",
            info.launcher,
            info.world_size,
            info.num_nodes,
            _master_address(info),
            chosen,
            "cpu" if device is None else f"cuda:{device}",
        )
    if seed is not None:
        from distenv.seeding import seed_everything

        seed_everything(seed)
    return info
