"""A hint's example command in the job's own words: its script and its number of ranks.

Launchers are pure functions of the environment, so their hints quote a generic command
(``mpirun -np 4 python train.py ...``). A user who ran ``mpirun -np 2 python main_tv.py`` and reads
``-np 4`` and ``train.py`` has to translate the fix back into their own job. Where an error leaves a
public call (`distenv.exits.one_line`), the script that is running and the size of its world are
known: `reword` puts them into the hint's example command in place of the generic ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from distenv.errors import DistEnvError

__all__ = ["EXAMPLE_SCRIPT", "personal", "reword", "script_of", "size_of"]

#: The script every built-in hint's example command runs.
EXAMPLE_SCRIPT = "train.py"
#: The example script as a word of a command: not part of a longer path or name.
_SCRIPT = r"(?<![\w./-])train\.py(?![\w.-])"
#: An MPI launcher's rank count in an example command: the world's size.
_COUNT = r"(\b(?:mpirun -np|mpirun -n|mpiexec -n) )\d+(?= )"
#: Variables that hold the world's size under the launchers that start ranks (the first set wins).
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
#: A size larger than this is no job anyone types on a command line: it is not quoted.
_MAX_SIZE_DIGITS = 7


def script_of(argv: Sequence[str]) -> str | None:
    """Return the Python script this process runs, as it was given (``sys.argv[0]``).

    None where there is no script to quote: ``python -c``, standard input, an interactive session,
    or a program that is not a ``.py`` file (the ``distenv`` command itself).
    """
    if not argv:
        return None
    script = argv[0]
    if not script.endswith(".py") or any(c.isspace() or c == "`" for c in script):
        return None
    return script


def size_of(env: Mapping[str, str]) -> int | None:
    """Return the world's size the launcher states in `env`, None where it states none."""
    for name in SIZE_VARS:
        value = env.get(name, "").strip()
        if value.isascii() and value.isdigit() and len(value) <= _MAX_SIZE_DIGITS:
            return int(value) or None
    return None


def personal(hint: str, script: str | None, size: int | None) -> str:
    """Return `hint` with its example command's script and MPI rank count made the job's own."""
    if script is not None:
        hint = re.sub(_SCRIPT, lambda _: script, hint)
    if size is not None:
        hint = re.sub(_COUNT, lambda m: f"{m.group(1)}{size}", hint)
    return hint


def reword(error: DistEnvError, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make `error`'s hint quote this job's script (`argv`) and size (`env`), message included."""
    if not error.hint:
        return
    hint = personal(error.hint, script_of(argv), size_of(env))
    if hint == error.hint:
        return
    message = str(error)
    old = f". Hint: {error.hint}"
    if message.endswith(old):  # a subclass that words its message otherwise is left as it is
        error.args = (message[: -len(old)] + f". Hint: {hint}", *error.args[1:])
        error.hint = hint
