"""Running a docs recipe: its blocks, as the page shows them, wrapped into a script and launched.

`script` joins a prelude (what the page assumes exists: `parser`, `model`, ...), the blocks whose
``<!-- run: ... -->`` marker names the test (tests/support/docblocks.py), and an epilogue (one optimizer
step, then `recipe_rank.report`). The only edits to the docs' text are the explicit `replace` pairs
(a CPU run swaps ``accelerator="gpu"`` for ``"cpu"``, ``nccl`` for ``gloo``), each of which must
apply. `check` reads what every rank reported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from textwrap import dedent
from typing import Any

from tests.support.docblocks import recipe
from tests.support.integration.helpers import DISTENV_RUN, PYTHON, REPO, Harness, Result

TIMEOUT_S = 240.0
# The CPU form of a recipe's GPU lines.
ON_CPU = (('accelerator="gpu"', 'accelerator="cpu"'), ('"nccl"', '"gloo"'))

# docs/start/huggingface.md's Trainer recipe (tests in test_recipes.py and test_slurm.py): what the
# page assumes (`model`, `train_dataset`) and the report after `trainer.train()`. 32 samples in
# batches of 8 on 2 ranks for the default 3 epochs make 6 steps; a rank training alone makes 12.
HF_TRAINER_PARTS = """
    from tests.support.integration import recipe_rank

    model, train_dataset = recipe_rank.hf_parts()
    before = recipe_rank.digest(model.parameters())
"""
HF_TRAINER_REPORT = """
    recipe_rank.report(
        trainer.args.world_size,
        before,
        recipe_rank.digest(model.parameters()),
        group_size=torch.distributed.get_world_size(),
        steps=trainer.state.global_step,
        node_rank=info.node_rank,
    )
"""
HF_TRAINER_STEPS = 6
# No download, ever: the model is built from a config, the inputs are tensors.
HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def docs_code(
    test_id: str,
    replace: Sequence[tuple[str, str]] = (),
    lang: str = "python",
    which: slice = slice(None),
) -> str:
    """Return the text of the blocks marked for `test_id` (`which` of them), with `replace` applied."""
    code = "".join(b.code for b in recipe(test_id, lang)[which])
    for old, new in replace:
        assert old in code, f"the recipe of {test_id} has no {old!r} to replace"
        code = code.replace(old, new)
    return code


def script(
    test_id: str,
    prelude: str = "",
    epilogue: str = "",
    replace: Sequence[tuple[str, str]] = (),
    which: slice = slice(None),
) -> str:
    """Return a script: `prelude`, the docs' blocks for `test_id` (`which`), then `epilogue`."""
    docs = docs_code(test_id, replace, which=which)
    return (
        f"{dedent(prelude).strip()}\n\n# ---- docs\n{docs}# ---- end of docs\n\n"
        f"{dedent(epilogue).strip()}\n"
    )


def launch(
    harness: Harness,
    label: str,
    code: str,
    *,
    nprocs: int | None = 2,
    start: Sequence[str] | None = None,
    cluster: str | None = None,
    args: Sequence[str] = (),
    files: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> tuple[Result, Path]:
    """Write `code` (and `files`) into a fresh folder and run it there.

    With `start` (``srun ... python``), under that command on the test Slurm cluster `cluster`;
    else with `nprocs`, under ``distenv run -n nprocs``; with None, as a plain ``python`` process.
    """
    out = harness.outdir(label)
    (out / "train.py").write_text(code, encoding="utf-8")
    for name, text in (files or {}).items():
        (out / name).write_text(text, encoding="utf-8")
    env = harness.env(
        cluster,
        extra={
            "PYTHONPATH": str(REPO),
            "RECIPE_OUT": str(out),
            "OMP_NUM_THREADS": "1",
            **(extra_env or {}),
        },
    )
    if start is None:
        start = [*DISTENV_RUN, "-n", str(nprocs)] if nprocs else [PYTHON]
    argv = [*start, "train.py", *args]
    result = harness.run(argv, cluster=cluster, env=env, cwd=out, timeout=timeout)
    return result, out


def check(result: Result, out: Path, world_size: int = 2) -> list[dict[str, Any]]:
    """Assert every rank saw `world_size` ranks, stepped, and ended with the same weights."""
    result.ok()
    paths = sorted(out.glob("rank*.json"))
    recs = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    assert [r["rank"] for r in recs] == list(range(world_size)), result.text
    for r in recs:
        assert r["world_size"] == world_size, (r, result.text)
        assert r["before"] != r["after"], f"rank {r['rank']}: the step changed no weight"
    assert len({r["after"] for r in recs}) == 1, f"the ranks' weights differ: {recs}"
    return recs


__all__ = [
    "HF_OFFLINE",
    "HF_TRAINER_PARTS",
    "HF_TRAINER_REPORT",
    "HF_TRAINER_STEPS",
    "ON_CPU",
    "check",
    "docs_code",
    "launch",
    "script",
]
