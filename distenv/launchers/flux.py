"""The `flux` launcher backend: tasks started by ``flux run`` / ``flux submit`` (Flux framework).

Flux cannot be installed on the project's test machines; the tests use environments recorded from
flux-core's documentation and sources (v0.88: flux-environment(7), ``src/shell/shell.c``,
``src/shell/task.c``, ``src/common/libutil/fluid.c``) and flux-coral2's ``cray_pals`` plug-in,
and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    warn,
)
from distenv.launchers.base import Scheduler, World
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["FluxLauncher", "job_number"]

FLUX_HINT = "start the tasks with `flux run -N 2 --tasks-per-node=4 python train.py`"
# F58 (flux-core src/common/libutil/fluid.c): a FLUID in base 58 (libbase58's alphabet) after the
# prefix "ƒ" (U+0192), or "f" where the job shell's locale is not UTF-8 or FLUX_F58_FORCE_ASCII is
# set. Each node's shell encodes FLUX_JOB_ID in its own locale, so both prefixes name one job.
F58_DIGITS = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
F58_PREFIXES = ("\u0192", "f")
F58_MAX_DIGITS = 12  # fluid.c MAX_B58_STRLEN: a 64-bit FLUID needs at most 11


def job_number(text: str) -> int | None:
    """Return the job id of `text` (F58 ``ƒ...``/``f...``, or decimal) as an integer, else None."""
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) <= 20:
        number = int(text)
    else:
        prefix = next((p for p in F58_PREFIXES if text.startswith(p)), None)
        digits = text[len(prefix) :] if prefix is not None else ""
        if not digits or len(digits) > F58_MAX_DIGITS or any(c not in F58_DIGITS for c in digits):
            return None
        number = 0
        for char in digits:
            number = number * 58 + F58_DIGITS.index(char)
    return number if number < 2**64 else None


class FluxLauncher(Scheduler):
    """Tasks started by ``flux run`` or ``flux submit`` in a Flux instance (flux-environment(7)).

    | variable | fills | required |
    |---|---|---|
    | FLUX_JOB_ID | job_id (F58, "ƒ..."), scope and port (as its number) | in a task |
    | FLUX_TASK_RANK | rank | in a task |
    | FLUX_JOB_SIZE | world_size | in a task |
    | FLUX_TASK_LOCAL_ID | local_rank | in a task |
    | FLUX_JOB_NNODES | num_nodes | in a task |
    | FLUX_URI | detection of an instance's initial program (flux batch, flux alloc) | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Flux names no node index, no tasks per node and no host list, and its task map may be cyclic
    (``flux run --taskmap``): the layout is known on one node, and with one task per node (node
    index = rank, numbered in order of their lowest rank); with several tasks on each of several
    nodes, the node index and the tasks per node are left unknown (None) and `init_dist`'s roll
    call fills them from the tasks' host names (nodes in order of their lowest rank, the tasks
    counted per host; FLUX_TASK_LOCAL_ID stays the local rank, checked against that count). No
    host is named either: the master comes from ``MASTER_ADDR`` or is exchanged over MPI. The
    job id is F58 ("ƒ" and base 58, "f" in an ASCII locale): the scope and the port use its
    number, alike on every node. The initial program of ``flux batch``/``flux alloc`` sees only
    ``FLUX_URI`` (the broker unsets the job's variables): no launch, it runs as rank 0 of 1.
    """

    name = "flux"
    how_to_start = (
        "submit it: `flux batch -N 2 job.sh` whose script runs `flux run -N 2 "
        "--tasks-per-node=1 python train.py`, or `flux run` from a `flux alloc` shell"
    )
    variables = (
        Var("FLUX_JOB_ID", "job_id", "in a task", "the job id in F58 ('ƒ2bYRvnoB'): scope, port"),
        Var("FLUX_TASK_RANK", "rank", "in a task", "global task rank (block or --taskmap order)"),
        Var("FLUX_JOB_SIZE", "world_size", "in a task", "number of tasks in the job"),
        Var("FLUX_TASK_LOCAL_ID", "local_rank", "in a task", "task rank on this node"),
        Var("FLUX_JOB_NNODES", "num_nodes", "in a task", "nodes (job shells) running tasks"),
        Var("FLUX_URI", "(detection)", "no", "the enclosing instance; alone: an initial program"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        return any(reader.has(v) for v in ("FLUX_TASK_RANK", "FLUX_JOB_ID", "FLUX_URI"))

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        rank = reader.optional_int("FLUX_TASK_RANK")
        if rank is None:
            return None
        return rank, reader.optional_int("FLUX_JOB_SIZE", minimum=1)

    def _job(self, reader: Reader) -> tuple[str, int] | None:
        """Return FLUX_JOB_ID as given and as its number, None when unset; raise if malformed."""
        text = reader.get("FLUX_JOB_ID")
        if text is None:
            return None
        number = job_number(text)
        if number is None:
            raise InvalidVariableError(
                self.name,
                "FLUX_JOB_ID",
                text,
                "a Flux job id in F58 ('ƒ' or 'f' and base-58 digits) or decimal",
                hint="let the Flux job shell set FLUX_JOB_ID; never set it by hand",
            )
        return text, number

    def scope(self, env: Mapping[str, str]) -> str:
        try:
            job = self._job(self.reader(env))
        except InvalidVariableError:
            job = None
        return scope_tag(self.name, None if job is None else str(job[1]), None)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        job = self._job(reader)
        if job is None:  # an initial program: rank 0 of 1 on a free port (no job id to derive)
            return Default(LOCAL_HOST, None, source=self.name)
        # No host in a task's environment: MASTER_ADDR, else rank 0's host over MPI.
        return Default(None, scheduler_port(str(job[1]), "0"), source=self.name)

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None  # no Flux variable names a host

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        if not reader.has("FLUX_TASK_RANK"):
            return self._initial_program(reader)
        job = self._job(reader)
        if job is None:
            raise MissingVariableError(self.name, "FLUX_JOB_ID", hint=FLUX_HINT)
        rank = reader.integer("FLUX_TASK_RANK", hint=FLUX_HINT)
        world_size = reader.integer("FLUX_JOB_SIZE", hint=FLUX_HINT, minimum=1)
        local_rank = reader.integer("FLUX_TASK_LOCAL_ID", hint=FLUX_HINT)
        nodes = reader.integer("FLUX_JOB_NNODES", hint=FLUX_HINT, minimum=1)
        sources = {
            "rank": "FLUX_TASK_RANK",
            "world_size": "FLUX_JOB_SIZE",
            "local_rank": "FLUX_TASK_LOCAL_ID",
            "num_nodes": "FLUX_JOB_NNODES",
        }
        if nodes == 1:  # every task on this node
            local_size, node_rank = world_size, 0
            sources.update(local_world_size="FLUX_JOB_SIZE", node_rank="FLUX_JOB_NNODES")
        elif nodes == world_size:  # one task per node: nodes numbered by their only rank
            local_size, node_rank = 1, rank
            sources.update(local_world_size="FLUX_JOB_NNODES", node_rank="FLUX_TASK_RANK")
        elif nodes > world_size:
            raise InconsistentEnvironmentError(
                self.name,
                f"$FLUX_JOB_NNODES={nodes} exceeds $FLUX_JOB_SIZE={world_size}: every node "
                "counted runs a task",
                hint="let the Flux job shell set FLUX_*; never set them by hand",
                variable="FLUX_JOB_NNODES",
                value=str(nodes),
            )
        else:
            # Several tasks on each of several nodes, evenly or not, in block or --taskmap order:
            # init_dist's roll call numbers this task's host and counts the tasks on it.
            local_size, node_rank = None, None
        return RankInfo.checked(
            self.name,
            sources,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_size,
            node_rank=node_rank,
            num_nodes=nodes,
            master_addr=None,
            master_port=None,
            job_id=job[0],
        )

    def _initial_program(self, reader: Reader) -> RankInfo:
        """The initial program of `flux batch`/`flux alloc`: no launch, rank 0 of 1."""
        warn(
            "flux: this is a Flux instance's initial program (flux batch or flux alloc), not a "
            "task of flux run; running as rank 0 of 1 (%s)",
            FLUX_HINT,
        )
        return RankInfo.single(self.name, master_addr=None)
