"""Whether an inner launcher's variables were set by a launch or left over from another job.

Two launcher layers agree when they number this process alike (`agrees`). Where an inner layer's
variables sit inside a scheduler step or MPI launch (torchrun's, whatever their numbering; MPI's,
where they disagree with the step), either a launcher inside the step started this process on
purpose, or the variables are leftovers: exported by an earlier job or a shell profile, or
inherited from an outer launcher. Detection (`distenv.detection.choice`) asks
`refuse_leftovers` before it chooses, over the same `distenv.detection.layer.Layers` it chooses from. The
rules:

1. **torchrun's contract.** ``RANK`` and ``WORLD_SIZE`` inside a step (an srun task, a jsrun rank,
   an MPI rank) are refused unless the launcher that set them marked them (`LAUNCH_MARKS`),
   whether they contradict the step's numbering or match it. Matching proves nothing: an earlier
   job's export matches one task of every later step of that size by chance, and sent that task
   to the old job's master while the others were refused. Only a step whose own launcher declares
   them sets them itself (a Kubeflow v1 pod's ``RANK`` is the pod's index), and only where they
   match. MPI launches count as steps: mpirun and mpiexec hand their ranks the environment they
   were started in, so a stale export reaches them just as it reaches srun's tasks, and distenv
   reads their ranks itself. ``DISTENV_SCOPE`` (the export tag) marks distenv's own export of
   another launcher's answer: no launch, judged by the export rules of `distenv.master` instead.
2. **MPI inside a task step.** MPI ranks that disagree with the scheduler step around them are the
   ranks of an MPI launcher whose daemons are that step's tasks, one per node (measured: mpirun and
   Hydra inside salloc, tests/support/envs/mpi.py). A step that runs several tasks on this node is no such
   daemon step: the MPI variables were inherited or exported.

Naming the inner launcher (``--launcher pytorch``, ``--launcher mpi``) says its variables are
meant: its rule is skipped. Reads the environment only: no torch, no mpi4py, no subprocess.
"""

from __future__ import annotations

from collections.abc import Sequence

from distenv.detection.layer import Layer, Layers
from distenv.errors import DistEnvError, InconsistentEnvironmentError
from distenv.launchers import AllocationLauncher, Scheduler, World
from distenv.launchers.registry import TORCHRUN
from distenv.launchers.torchrun import TorchrunLauncher
from distenv.master import RUN_ID_VAR, SCOPE_VAR
from distenv.variables import Reader, Var

__all__ = ["LAUNCH_MARKS", "MARK_VARS", "agrees", "describe", "refuse_leftovers"]

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


def _contract_leftover(
    layers: Layers, detected: Sequence[Layer], notes: list[tuple[str, str]]
) -> None:
    """Rule 1: torchrun's RANK/WORLD_SIZE inside a step, set by no launcher that marks its ranks."""
    reader = Reader(TORCHRUN.name, layers.env, MARK_VARS)
    tag = reader.get(SCOPE_VAR)
    if tag is not None and not tag.startswith(f"{TORCHRUN.name}/"):
        return
    if any(all(reader.has(name) for name in names) for _, names in LAUNCH_MARKS):
        return
    torchrun = layers[TORCHRUN]
    contract = _world(torchrun)
    step = _step(detected)
    if contract is None or contract[1] is None or step is None:
        return
    layer, world = step
    matches = agrees(contract, world)
    if matches and _sets_contract(layer):
        return
    names = _present(torchrun, _CONTRACT)
    marks = ", ".join(" ".join(vs) for _, vs in LAUNCH_MARKS)
    if matches:
        verb = "match"
        chance = (
            "; that they match this task proves nothing: an earlier job's export matches one "
            "task of every step of its size"
        )
        note = f"{describe(contract)} as {layer.name}'s, but no launcher's mark"
    else:
        verb, chance = "contradict", ""
        note = f"{describe(contract)} vs {layer.name}'s {describe(world)} and no launcher's mark"
    notes.append((TORCHRUN.name, f"refused: {note}: left over from another job"))
    # --launcher pytorch is a way out only where its variables are complete enough to detect.
    named = " (or pass --launcher pytorch if a wrapper inside the step sets them on purpose)"
    raise InconsistentEnvironmentError(
        TORCHRUN.name,
        f"{torchrun.named(contract)} {verb} {layer.name}, which started this process as "
        f"{layer.named(world)}, and were not set by any launcher inside the step (none marked "
        f"them as its own: {marks}): they were likely exported by an earlier job or a shell "
        f"profile{chance}",
        hint=f"unset {' '.join(names)} where they are exported (job script, ~/.bashrc): distenv "
        f"reads {layer.name}'s numbering itself" + (named if torchrun.detected() else ""),
        variable="RANK",
        value=str(contract[0]),
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
) -> None:
    """Raise if leftover launcher variables contradict the step that started this process.

    Args:
        named: The layer of the launcher asked for by name; None for auto detection. Naming
            the inner launcher whose variables are in question skips its rule.
        layers: The environment's layers (torchrun's contract is read from them).
        detected: The layers detected, innermost first.
        notes: Detection's reasons; the refusal adds its line.

    Raises:
        InconsistentEnvironmentError: Naming both sets of variables, the likely cause and the fix.
    """
    if named is None or not isinstance(named.launcher, TorchrunLauncher):
        _contract_leftover(layers, detected, notes)
    if (
        detected
        and isinstance(detected[0].launcher, AllocationLauncher)
        and named is not detected[0]
    ):
        _mpi_leftover(detected, notes)
