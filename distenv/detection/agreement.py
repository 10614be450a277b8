"""Whether an inner launcher's variables were set by a launch or left over from another job.

Two launcher layers agree when they number this process alike (`agrees`). Where an inner layer's
variables sit inside a scheduler step or MPI launch (torchrun's, whatever their numbering; MPI's,
where they disagree with the step), either a launcher inside the step started this process on
purpose, or the variables are leftovers: exported by an earlier job or a shell profile, or
inherited from an outer launcher. Detection (`distenv.detection.choice`) asks
`refuse_leftovers` before it chooses, over the same `distenv.detection.layer.Layers` it chooses from. The
rules:

1. **torchrun's contract.** ``RANK`` and ``WORLD_SIZE`` inside a step (an srun task, a jsrun rank,
   an MPI rank) that the launcher that set them did not mark (`LAUNCH_MARKS`) are accepted only
   as a translation of the step's numbering of this task: a wrapper script's ``export
   RANK=$SLURM_PROCID ...`` or enroot's PyTorch hook. Every layout variable of `TRANSLATED` that
   is set must equal the step's, and ``MASTER_ADDR``, where set, must name the step's or the job's
   first host (loopback on one node): then the step's layout is used with the user's
   ``MASTER_ADDR``/``MASTER_PORT``. Anything else is refused on the task, naming the variable and
   both values: an earlier job's export contradicts all but one task of a later step of its size,
   and that one by its ``MASTER_ADDR`` (until issue #25 that task went to the old job's master
   while the others were refused). A step whose own launcher declares them sets them itself (a
   Kubeflow v1 pod's ``RANK`` is the pod's index), where they match. MPI launches count as steps:
   mpirun and mpiexec hand their ranks the environment they were started in, so a stale export
   reaches them just as it reaches srun's tasks, and distenv reads their ranks itself.
   ``DISTENV_SCOPE`` (the export tag) marks distenv's own export of another launcher's answer: no
   launch, judged by the export rules of `distenv.master` instead.
2. **MPI inside a task step.** MPI ranks that disagree with the scheduler step around them are the
   ranks of an MPI launcher whose daemons are that step's tasks, one per node (measured: mpirun and
   Hydra inside salloc, tests/support/envs/mpi.py). A step that runs several tasks on this node is no such
   daemon step: the MPI variables were inherited or exported.

Naming the inner launcher (``--launcher pytorch``, ``--launcher mpi``) says its variables are
meant: its rule is skipped. Reads the environment only: no torch, no mpi4py, no subprocess.
"""

from __future__ import annotations

from collections.abc import Sequence

from distenv._hosts import check_hostname
from distenv.detection.layer import Layer, Layers
from distenv.errors import DistEnvError, InconsistentEnvironmentError, NotLaunchedError, shown
from distenv.launchers import AllocationLauncher, Scheduler, World
from distenv.launchers.registry import TORCHRUN
from distenv.launchers.torchrun import TorchrunLauncher
from distenv.master import LOCAL_HOST, RUN_ID_VAR, SCOPE_VAR, map_master_host
from distenv.variables import Reader, Var

__all__ = ["LAUNCH_MARKS", "MARK_VARS", "TRANSLATED", "agrees", "describe", "refuse_leftovers"]

# The launchers that set torchrun's contract inside a scheduler step on purpose, and the variables
# (all of them) by which their ranks are known.
LAUNCH_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchrun", ("TORCHELASTIC_RUN_ID",)),
    ("distenv run", (RUN_ID_VAR,)),
    # deepspeed/launcher/launch.py (DeepSpeed edaa722, main()): beside RANK, LOCAL_RANK,
    # WORLD_SIZE and MASTER_* it sets these three, and no TORCHELASTIC_* (but in elastic mode).
    ("DeepSpeed's launcher", ("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")),
)
MARK_VARS = (
    Var("TORCHELASTIC_RUN_ID", "(agreement)", "no", "torchrun's ranks: their RANK/... are meant"),
    Var(RUN_ID_VAR, "(agreement)", "no", "distenv run's and launch()'s ranks (distenv.local.plan)"),
    Var("CROSS_RANK", "(agreement)", "no", "DeepSpeed's launcher: node index"),
    Var("CROSS_SIZE", "(agreement)", "no", "DeepSpeed's launcher: number of nodes"),
    Var("LOCAL_SIZE", "(agreement)", "no", "DeepSpeed's launcher: processes on this node"),
    Var(SCOPE_VAR, "(agreement)", "no", "distenv's export of another launcher's answer"),
)
# torchrun's variables a translation of a step's numbering may set, and the RankInfo field each
# must equal. enroot's PyTorch hook (NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh) sets
# RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID; inside a step of 2 in an
# allocation of 4, SLURM_NTASKS is the step's 2 (measured: salloc and sbatch, Slurm 22.05).
TRANSLATED = (
    ("RANK", "rank"),
    ("WORLD_SIZE", "world_size"),
    ("LOCAL_RANK", "local_rank"),
    ("LOCAL_WORLD_SIZE", "local_world_size"),
    ("GROUP_RANK", "node_rank"),
    ("GROUP_WORLD_SIZE", "num_nodes"),
)
# RankInfo fields whose variables make up a launcher's numbering (named in the messages).
_LAYOUT = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "num_nodes")
_CONTRACT = (*_LAYOUT, "master_addr", "master_port")


def agrees(inner: World | None, outer: World | None) -> bool:
    """Return whether two layers give the same rank, and the same size where both state one."""
    if inner is None or outer is None or inner[0] != outer[0]:
        return False
    return inner[1] is None or outer[1] is None or inner[1] == outer[1]


def _world(layer: Layer) -> World | None:
    try:
        return layer.world()
    except DistEnvError:  # malformed: the chosen launcher's own reading reports it
        return None


def describe(world: World | None) -> str:
    """Return how a layer numbers this process, for reasons and errors (``rank 3 of 8``)."""
    if world is None:
        return "no rank"
    return f"rank {world[0]} of {world[1] if world[1] is not None else '?'}"


def _present(layer: Layer, fields: Sequence[str]) -> list[str]:
    return [v.name for v in layer.launcher.variables if v.field in fields and layer.env.get(v.name)]


def _step(detected: Sequence[Layer]) -> tuple[Layer, World] | None:
    """Return the innermost layer besides torchrun's contract that numbers this process.

    Where the next layer agrees with it (MPI ranks that are srun's or jsrun's tasks), that outer
    layer is the step: it states the size too, and detection uses its layout.
    """
    layers = [
        (layer, world)
        for layer in detected
        if not isinstance(layer.launcher, TorchrunLauncher) and (world := _world(layer)) is not None
    ]
    if len(layers) > 1 and agrees(layers[0][1], layers[1][1]):
        return layers[1]
    return layers[0] if layers else None


def _sets_contract(layer: Layer) -> bool:
    """Return whether `layer`'s launcher declares torchrun's rank and size variables as its own."""
    contract = {v.name for v in TORCHRUN.variables if v.field in ("rank", "world_size")}
    return contract <= {v.name for v in layer.launcher.variables}


def _int_text(text: str | None) -> int | None:
    try:
        return None if text is None else int(text.strip())
    except ValueError:
        return None


def _var_of(layer: Layer, field: str, value: int) -> str:
    """Return ``VAR=value`` for the declared variable of `layer` that holds `value` for `field`,
    else ``value (VAR=its text)`` for one that encodes it (``SLURM_STEP_TASKS_PER_NODE=2(x2)``)."""
    declared = [v.name for v in layer.launcher.variables if v.field == field]
    texts = {name: (layer.env.get(name) or "").strip() for name in declared}
    exact = next((name for name in declared if texts[name] == str(value)), None)
    if exact is not None:
        return f"{exact}={value}"
    encoded = next((name for name in declared if texts[name]), None)
    return f"{value} ({encoded}={texts[encoded]})" if encoded else f"{field}={value}"


def _differences(torchrun: Layer, step: Layer, world: World) -> list[tuple[str, str, str]]:
    """Return ``(variable, its value, the step's)`` for each of torchrun's layout variables set
    that differs from the step's numbering of this task (`TRANSLATED`)."""
    try:
        info = step.rank_info()
        known = {field: getattr(info, field) for _, field in TRANSLATED}
    except DistEnvError:  # the step's own reading reports it; compare what `world` states
        known = {"rank": world[0], "world_size": world[1]}
    found = []
    for name, field in TRANSLATED:
        text, expected = torchrun.env.get(name), known.get(field)
        if not text or expected is None or _int_text(text) == expected:
            continue
        found.append((name, text, _var_of(step, field, expected)))
    return found


def _foreign_master(step: Layer) -> tuple[str, str] | None:
    """Return ``(MASTER_ADDR, the hosts it should name)`` where MASTER_ADDR names no host a
    translation of `step`'s numbering would: the first host of the step or of the job (enroot's
    hook takes the step's, cluster guides' wrappers the job's), mapped by
    ``DISTENV_MASTER_ADDR_FORMAT`` where set (``{host}-ib``), or loopback on one node."""
    addr = (step.env.get("MASTER_ADDR") or "").strip()
    if not addr or not isinstance(step.launcher, Scheduler):
        return None
    try:
        check_hostname(step.name, "MASTER_ADDR", addr)  # else the master rules name it
        hosts = [d.host for d in (step.default_master(), step.allocation_master()) if d and d.host]
        hosts += [map_master_host(step.name, step.env, h) for h in hosts]
        nodes = step.rank_info().num_nodes
    except DistEnvError:
        return None
    if not hosts or hosts[0] == LOCAL_HOST:  # a batch script: no step's hosts to compare
        return None
    label = addr.split(".", 1)[0].lower()
    if label in {h.split(".", 1)[0].lower() for h in hosts}:
        return None
    if nodes == 1 and (addr == "localhost" or addr.startswith("127.") or addr == "::1"):
        return None
    return addr, " or ".join(dict.fromkeys(hosts))


def _outside_steps(
    torchrun: Layer, contract: World, detected: Sequence[Layer], notes: list[tuple[str, str]]
) -> None:
    """Rule 1, outside any step: a translation's contract (LOCAL_RANK, no LOCAL_WORLD_SIZE: what a
    wrapper or enroot's hook sets) in a batch script or salloc shell that the scheduler itself
    refuses to run (a job of several tasks) was set with no step, by no launch."""
    env = torchrun.env
    if not env.get("LOCAL_RANK") or env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE"):
        return  # torchrun's full contract: read as before (a launcher's, or refused by signs)
    for layer in detected:
        if not isinstance(layer.launcher, Scheduler) or layer.world() is not None:
            continue
        try:
            layer.rank_info()
        except NotLaunchedError as exc:
            notes.append((TORCHRUN.name, f"refused: {describe(contract)} set with no step"))
            raise InconsistentEnvironmentError(
                TORCHRUN.name,
                f"{torchrun.named(contract)} were set with no step and no launcher's mark: "
                f"{exc.problem}; they were likely exported by an earlier job or a shell profile",
                hint=exc.hint,
                variable="RANK",
                value=str(contract[0]),
            ) from None


def _contract_leftover(
    layers: Layers, detected: Sequence[Layer], notes: list[tuple[str, str]]
) -> Layer | None:
    """Rule 1: torchrun's RANK/WORLD_SIZE inside a step, set by no launcher that marks its ranks.

    Returns torchrun's layer where its variables translate the step's numbering (accepted).
    """
    reader = Reader(TORCHRUN.name, layers.env, MARK_VARS)
    tag = reader.get(SCOPE_VAR)
    if tag is not None and not tag.startswith(f"{TORCHRUN.name}/"):
        return None
    if any(all(reader.has(name) for name in names) for _, names in LAUNCH_MARKS):
        return None
    torchrun = layers[TORCHRUN]
    contract = _world(torchrun)
    step = _step(detected)
    if contract is None or contract[1] is None:
        return None
    if step is None:
        _outside_steps(torchrun, contract, detected, notes)
        return None
    layer, world = step
    if agrees(contract, world) and _sets_contract(layer):
        return None
    differences = _differences(torchrun, layer, world)
    foreign = None if differences else _foreign_master(layer)
    shown_vars = " ".join(
        f"{n}={torchrun.env[n].strip()}" for n, _ in TRANSLATED if n in torchrun.env
    )
    if not differences and foreign is None:
        notes.append(
            (
                TORCHRUN.name,
                f"accepted: {shown_vars} translate {layer.name}'s numbering of this task "
                f"(set by a wrapper or a container hook): {layer.name}'s layout used, "
                "MASTER_ADDR/MASTER_PORT where set",
            )
        )
        return torchrun
    names = _present(torchrun, _CONTRACT)
    marks = ", ".join(" ".join(vs) for _, vs in LAUNCH_MARKS)
    if differences:
        verb = "contradict"
        why = "; ".join(f"{n}={shown(v)} where {layer.name} has {s}" for n, v, s in differences)
        variable, value = differences[0][0], differences[0][1]
        fix = f"copy {layer.name}'s numbering of the task"
        note = f"{describe(contract)} vs {layer.name}'s {describe(world)}"
    else:
        assert foreign is not None
        verb = "match"
        why = (
            f"MASTER_ADDR={shown(foreign[0])} names no host of this job, whose step and job start on "
            f"{foreign[1]}: a value from another job"
        )
        variable, value = "MASTER_ADDR", foreign[0]
        fix = f"set MASTER_ADDR to {foreign[1]}"
        note = f"{describe(contract)} as {layer.name}'s, MASTER_ADDR of another job"
    notes.append((TORCHRUN.name, f"refused: {note}: left over from another job"))
    # --launcher pytorch is a way out only where its variables are complete enough to detect, and
    # number the tasks as the step does (else it would wait for ranks that never start).
    named = " (or pass --launcher pytorch if a wrapper inside the step sets them on purpose)"
    offered = not differences and torchrun.detected()
    raise InconsistentEnvironmentError(
        TORCHRUN.name,
        f"{torchrun.named(contract)} {verb} {layer.name}, which started this process as "
        f"{layer.named(world)}, and were not set by any launcher inside the step (none marked "
        f"them as its own: {marks}): {why}. distenv accepts them there only as a translation of "
        f"{layer.name}'s numbering of this task; these were likely exported by an earlier job or "
        "a shell profile, or set by a wrapper script or container hook (enroot's "
        "50-slurm-pytorch.sh) that numbers the tasks otherwise",
        hint=f"unset {' '.join(names)} where they are exported (job script, ~/.bashrc), or "
        f"make the wrapper {fix}: distenv reads {layer.name}'s numbering itself"
        + (named if offered else ""),
        variable=variable,
        value=value,
    )


def _mpi_leftover(detected: Sequence[Layer], notes: list[tuple[str, str]]) -> None:
    """Rule 2: MPI ranks contradicting a scheduler step that runs several tasks on this node."""
    inner = detected[0]
    inner_world = _world(inner)
    outer = next(
        (
            (s, w)
            for s in detected[1:]
            if isinstance(s.launcher, Scheduler) and (w := _world(s)) is not None
        ),
        None,
    )
    if inner_world is None or outer is None or agrees(inner_world, outer[1]):
        return
    scheduler, world = outer
    try:
        local = scheduler.rank_info().local_world_size
    except DistEnvError:
        return
    if local is None or local < 2:  # one task per node (or unknown): maybe an MPI's daemons
        return
    names = _present(inner, _LAYOUT)
    notes.append(
        (
            inner.name,
            f"refused: {describe(inner_world)} vs {scheduler.name}'s {describe(world)} with "
            f"{local} tasks on this node: no MPI launcher's daemon step, left over",
        )
    )
    raise InconsistentEnvironmentError(
        inner.name,
        f"{inner.named(inner_world)} contradict {scheduler.name}, which started this "
        f"process as {scheduler.named(world)}, one of {local} tasks on this node; an MPI "
        "launcher's daemons run one task per node, so no MPI launcher started it: these MPI "
        "variables were likely inherited from an outer mpirun or mpiexec, or exported by an "
        "earlier job or a shell profile",
        hint=f"unset {' '.join(names[:4])}{' ...' if len(names) > 4 else ''} and the outer MPI "
        "launcher's other variables before srun (or pass --launcher mpi if an MPI launcher "
        "inside the step started this process)",
        variable=names[0] if names else None,
        value=str(inner_world[0]),
    )


def refuse_leftovers(
    named: Layer | None,
    layers: Layers,
    detected: Sequence[Layer],
    notes: list[tuple[str, str]],
) -> Layer | None:
    """Raise if leftover launcher variables contradict the step that started this process.

    Returns torchrun's layer where its variables translate the step's numbering of this task
    (rule 1): the caller sets it aside and reads the step's layout.

    Args:
        named: The layer of the launcher asked for by name; None for auto detection. Naming
            the inner launcher whose variables are in question skips its rule.
        layers: The environment's layers (torchrun's contract is read from them).
        detected: The layers detected, innermost first.
        notes: Detection's reasons; the refusal adds its line.

    Raises:
        InconsistentEnvironmentError: Naming both sets of variables, the likely cause and the fix.
    """
    translated = None
    if named is None or not isinstance(named.launcher, TorchrunLauncher):
        translated = _contract_leftover(layers, detected, notes)
    inner = [layer for layer in detected if layer is not translated]
    if inner and isinstance(inner[0].launcher, AllocationLauncher) and named is not inner[0]:
        _mpi_leftover(inner, notes)
    return translated
