"""Every recipe of docs/start/ and docs/migration.md, run as the page shows it.

Each test reads its blocks from the page (the ``<!-- run: ... -->`` marker before a block names
the test: tests/support/docblocks.py), wraps them into a script (tests/support/integration/recipes.py) and starts
it under ``distenv run -n 2`` on CPU, with the framework versions of setup.cfg's ``frameworks``
extra. Every rank trains on different data; the test asserts that both ranks saw world size 2,
that the optimizer step changed the weights, and that the weights are equal on both ranks after
it. The ``gpu`` tests run the same text unchanged (``accelerator="gpu"``, ``nccl``) on one GPU.
"""

from __future__ import annotations

import json
from textwrap import dedent

import pytest

from tests.support.docblocks import recipe
from tests.support.integration.helpers import OMPI, PYTHON, STATE, Harness
from tests.support.integration.recipes import (
    HF_OFFLINE,
    HF_TRAINER_PARTS,
    HF_TRAINER_REPORT,
    HF_TRAINER_STEPS,
    ON_CPU,
    check,
    docs_code,
    launch,
    script,
)

HERE = "tests/integration/test_recipes.py::"


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """Launches on this machine only: the recipes need no Slurm cluster and no MPI."""
    return Harness.local(tmp_path_factory.mktemp("recipes"))


Replace = tuple[tuple[str, str], ...]
Env = dict[str, str]

PLAIN = """
    import torch
    from tests.support.integration import recipe_rank

    model = recipe_rank.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


# ---- Hugging Face accelerate -------------------------------------------------------------------

ACCELERATE_STEP = """
    before = recipe_rank.digest(model.parameters())
    accelerator.backward(recipe_rank.loss(model))
    optimizer.step()
    recipe_rank.report(
        accelerator.num_processes,
        before,
        recipe_rank.digest(model.parameters()),
        distributed_type=str(accelerator.distributed_type),
    )
"""


def test_accelerate(harness: Harness) -> None:
    """docs/start/frameworks.md's accelerate recipe: MULTI_CPU, one step, equal weights."""
    code = script(HERE + "test_accelerate", PLAIN, ACCELERATE_STEP)
    recs = check(*launch(harness, "accelerate", code))
    assert {r["distributed_type"] for r in recs} == {"DistributedType.MULTI_CPU"}


@pytest.mark.gpu
def test_accelerate_gpu(harness: Harness) -> None:
    """The same recipe on one GPU: accelerate uses CUDA."""
    code = script(HERE + "test_accelerate_gpu", PLAIN, ACCELERATE_STEP)
    recs = check(*launch(harness, "accelerate-gpu", code, nprocs=1), world_size=1)
    assert recs[0]["distributed_type"] != "DistributedType.MULTI_CPU"


# ---- Hugging Face transformers.Trainer ----------------------------------------------------------


def test_hf_trainer(harness: Harness) -> None:
    """docs/start/huggingface.md's Trainer recipe with setup(): both ranks train as one (DDP, gloo)."""
    code = script(HERE + "test_hf_trainer", HF_TRAINER_PARTS, HF_TRAINER_REPORT)
    recs = check(*launch(harness, "hf-trainer", code, extra_env=HF_OFFLINE))
    assert [(r["group_size"], r["steps"], r["node_rank"]) for r in recs] == [
        (2, HF_TRAINER_STEPS, 0),
        (2, HF_TRAINER_STEPS, 0),
    ]


# ---- DeepSpeed ---------------------------------------------------------------------------------

DEEPSPEED_STEP = """
    before = recipe_rank.digest(engine.module.parameters())
    engine.backward(recipe_rank.loss(engine))
    engine.step()
    recipe_rank.report(
        deepspeed.comm.get_world_size(), before, recipe_rank.digest(engine.module.parameters())
    )
"""


def _deepspeed(harness: Harness, test: str, nprocs: int, replace: Replace, env: Env) -> None:
    """Run the DeepSpeed recipe with the page's ds_config.json.

    DeepSpeed JIT-compiles its shared-memory allreduce op on the first init (one to three minutes
    on 2 busy cores); TORCH_EXTENSIONS_DIR keeps the build in the test state folder, so it happens
    once per machine.
    """
    config = docs_code(HERE + test, lang="json")
    code = script(HERE + test, PLAIN, DEEPSPEED_STEP, replace)
    env = {"TORCH_EXTENSIONS_DIR": str(STATE / "torch-extensions"), **env}
    files = {"ds_config.json": config}
    launched = launch(harness, test, code, nprocs=nprocs, files=files, extra_env=env, timeout=480)
    check(*launched, world_size=nprocs)


def test_deepspeed(harness: Harness) -> None:
    """docs/start/frameworks.md's DeepSpeed recipe with gloo and DS_ACCELERATOR=cpu."""
    _deepspeed(harness, "test_deepspeed", 2, ON_CPU[1:], {"DS_ACCELERATOR": "cpu"})


@pytest.mark.gpu
def test_deepspeed_gpu(harness: Harness) -> None:
    """The same recipe unchanged (nccl) on one GPU."""
    _deepspeed(harness, "test_deepspeed_gpu", 1, (), {})


# ---- Lightning ---------------------------------------------------------------------------------

LIGHTNING_PARTS = """
    import torch
    from tests.support.integration import recipe_rank

    model, datamodule = recipe_rank.lightning_parts()
"""
TRAINER_REPORT = """
    recipe_rank.report(trainer.world_size, model.before, model.after)
"""
FABRIC_STEP = """
    before = recipe_rank.digest(model.parameters())
    fabric.backward(recipe_rank.loss(model))
    optimizer.step()
    recipe_rank.report(fabric.world_size, before, recipe_rank.digest(model.parameters()))
"""


def _lightning(harness: Harness, test: str, prelude: str, epilogue: str, gpu: bool) -> None:
    """Run a Lightning recipe, with the page's distenv_lightning.py beside it."""
    env_class = docs_code(HERE + test, which=slice(1))
    code = script(HERE + test, prelude, epilogue, () if gpu else ON_CPU[:1], which=slice(1, None))
    launched = launch(
        harness, test, code, nprocs=1 if gpu else 2, files={"distenv_lightning.py": env_class}
    )
    check(*launched, world_size=1 if gpu else 2)


def test_lightning_trainer(harness: Harness) -> None:
    """docs/start/frameworks.md's DistenvEnvironment with the Trainer, ddp on CPU."""
    _lightning(harness, "test_lightning_trainer", LIGHTNING_PARTS, TRAINER_REPORT, gpu=False)


@pytest.mark.gpu
def test_lightning_trainer_gpu(harness: Harness) -> None:
    """The Trainer recipe unchanged (accelerator="gpu") on one GPU."""
    _lightning(harness, "test_lightning_trainer_gpu", LIGHTNING_PARTS, TRAINER_REPORT, gpu=True)


def test_lightning_fabric(harness: Harness) -> None:
    """docs/start/frameworks.md's DistenvEnvironment with Fabric, ddp on CPU."""
    _lightning(harness, "test_lightning_fabric", PLAIN, FABRIC_STEP, gpu=False)


@pytest.mark.gpu
def test_lightning_fabric_gpu(harness: Harness) -> None:
    """The Fabric recipe unchanged (accelerator="gpu") on one GPU."""
    _lightning(harness, "test_lightning_fabric_gpu", PLAIN, FABRIC_STEP, gpu=True)


def test_lightning_devices_mismatch(harness: Harness) -> None:
    """devices x num_nodes != the ranks started: the error names `distenv run` and the fix."""
    env_class = docs_code(HERE + "test_lightning_devices_mismatch")
    code = """
        import lightning as L
        from distenv_lightning import DistenvEnvironment

        L.Trainer(accelerator="cpu", devices=1, strategy="ddp", plugins=[DistenvEnvironment()])
    """
    result, _ = launch(
        harness, "lightning-mismatch", dedent(code), files={"distenv_lightning.py": env_class}
    )
    assert result.returncode != 0, result.text
    assert (
        "Lightning computed world_size=1 (devices x num_nodes), but distenv run started 2 ranks; "
        "pass devices=2, num_nodes=1" in result.stderr
    ), result.text


# ---- plain DDP, distenv.launch -----------------------------------------------------------------

ARGPARSE = """
    import argparse

    parser = argparse.ArgumentParser()
"""
DDP_STEP = """
    before = recipe_rank.digest(ddp.parameters())
    recipe_rank.loss(ddp).backward()
    optimizer.step()
    recipe_rank.report(
        torch.distributed.get_world_size(),
        before,
        recipe_rank.digest(ddp.parameters()),
        backend=torch.distributed.get_backend(),
    )
"""


def test_plain_ddp(harness: Harness) -> None:
    """docs/migration.md's torch.distributed.launch replacement: init_dist, then DDP on the
    device distenv.current_device() names (gloo, cpu, no device_ids)."""
    code = script(HERE + "test_plain_ddp", ARGPARSE + PLAIN, DDP_STEP)
    recs = check(*launch(harness, "plain-ddp", code))
    assert {r["backend"] for r in recs} == {"gloo"}


# ---- torchvision's init_distributed_mode --------------------------------------------------------

TORCHVISION_STEP = """
    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.1)
    before = recipe_rank.digest(model.parameters())
    recipe_rank.loss(model).backward()
    optimizer.step()
    recipe_rank.report(
        torch.distributed.get_world_size(),
        before,
        recipe_rank.digest(model.parameters()),
        args=[args.rank, args.world_size, args.distributed],
        device=str(device),
        ddp=type(model).__name__,
    )
"""


def _torchvision(harness: Harness, test: str, start: list[str] | None) -> None:
    """Run the torchvision port on 2 CPU ranks: `start` (argv before ``train.py``), else
    ``distenv run -n 2``; check the ported ``args`` fields and that DDP trained on cpu."""
    code = script(HERE + test, ARGPARSE + PLAIN, TORCHVISION_STEP)
    recs = check(*launch(harness, test, code, start=start))
    for r in recs:
        assert r["args"] == [r["rank"], 2, True], r
        assert (r["device"], r["ddp"]) == ("cpu", "DistributedDataParallel"), r


def test_torchvision_port(harness: Harness) -> None:
    """docs/migration.md's init_distributed_mode port under `distenv run -n 2`."""
    _torchvision(harness, "test_torchvision_port", None)


@pytest.mark.mpi
def test_torchvision_port_under_mpirun(harness: Harness) -> None:
    """The same text under `mpirun.openmpi -np 2`: no MASTER_*, one machine."""
    _torchvision(
        harness,
        "test_torchvision_port_under_mpirun",
        [*OMPI, "--oversubscribe", "-np", "2", PYTHON],
    )


@pytest.mark.gpu
def test_plain_ddp_gpu(harness: Harness) -> None:
    """The same recipe on one GPU: init_dist picks nccl."""
    code = script(HERE + "test_plain_ddp_gpu", ARGPARSE + PLAIN, DDP_STEP)
    recs = check(*launch(harness, "plain-ddp-gpu", code, nprocs=1), world_size=1)
    assert recs[0]["backend"] == "nccl"


def test_launch(harness: Harness) -> None:
    """docs/start/local.md's distenv.launch recipe: one result per rank, in rank order."""
    report = """
        if __name__ == "__main__":
            import json
            import os
            from pathlib import Path

            Path(os.environ["RECIPE_OUT"], "results.json").write_text(json.dumps(results))
    """
    result, out = launch(harness, "launch", script(HERE + "test_launch", "", report), nprocs=None)
    result.ok()
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results == [{"rank": r, "world_size": 2, "lr": 0.1} for r in range(2)]


def test_detectron2_launch(harness: Harness) -> None:
    """docs/migration.md's detectron2 replacement: distenv.launch with detectron2's arguments."""
    prelude = """
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--num-gpus", type=int, default=2)
        parser.add_argument("--num-machines", type=int, default=1)
        parser.add_argument("--machine-rank", type=int, default=0)
        parser.add_argument("--master-addr", default="127.0.0.1")
    """
    report = """
        if __name__ == "__main__":
            import os
            from pathlib import Path

            Path(os.environ["RECIPE_OUT"], "done").write_text("ok")
    """
    code = script(HERE + "test_detectron2_launch", prelude, report)
    result, out = launch(harness, "detectron2", code, nprocs=None)
    result.ok()
    assert (out / "done").read_text() == "ok"


# ---- mmengine ----------------------------------------------------------------------------------

MMENGINE = """
    import argparse

    import mmengine.dist
    from tests.support.integration import recipe_rank

    parser = argparse.ArgumentParser()
    model, train_dataloader = recipe_rank.mmengine_parts()
    before = recipe_rank.digest(model.parameters())
"""
MMENGINE_REPORT = """
    recipe_rank.report(
        world_size,
        before,
        recipe_rank.digest(model.parameters()),
        distenv=[rank, world_size],
        mmengine=list(mmengine.dist.get_dist_info()),
        is_distributed=mmengine.dist.is_distributed(),
        rank_size=[mmengine.dist.get_rank(), mmengine.dist.get_world_size()],
    )
"""


def test_mmengine(harness: Harness) -> None:
    """docs/migration.md's mmengine recipe under distenv run: helpers agree, the Runner trains."""
    code = script(HERE + "test_mmengine", MMENGINE, MMENGINE_REPORT)
    recs = check(*launch(harness, "mmengine", code))
    for r in recs:
        assert r["mmengine"] == r["distenv"] == [r["rank"], 2]
        assert r["rank_size"] == r["distenv"]
        assert r["is_distributed"] is True


def test_mmengine_launcher_none(harness: Harness) -> None:
    """With --launcher none the recipe creates no group: mmengine sees one process, as before.

    distenv.init_dist("none") itself still creates its 1-rank group (what the page warns about).
    """
    one_rank_group = """
        import json
        import os
        from pathlib import Path

        distenv.init_dist("none")
        group = {"is_distributed": mmengine.dist.is_distributed()}
        Path(os.environ["RECIPE_OUT"], "group.json").write_text(json.dumps(group))
    """
    code = script(
        HERE + "test_mmengine_launcher_none",
        MMENGINE,
        dedent(MMENGINE_REPORT) + dedent(one_rank_group),
    )
    launched = launch(harness, "mmengine-none", code, nprocs=None, args=["--launcher", "none"])
    [rec] = check(*launched, world_size=1)
    assert rec["mmengine"] == rec["distenv"] == [0, 1]
    assert rec["rank_size"] == [0, 1]
    assert rec["is_distributed"] is False
    group = json.loads((launched[1] / "group.json").read_text(encoding="utf-8"))
    assert group == {"is_distributed": True}


# ---- the gpu twins -------------------------------------------------------------------------------

GPU_TWINS = sorted(name for name in globals() if name.startswith("test_") and name.endswith("_gpu"))


def _marked(test_id: str, lang: str) -> list[str]:
    """Return where the page blocks of `lang` marked for `test_id` are (none: an empty list)."""
    try:
        return [block.where for block in recipe(test_id, lang)]
    except LookupError:
        return []


@pytest.mark.parametrize("gpu_test", GPU_TWINS)
def test_a_gpu_recipe_runs_the_blocks_its_cpu_twin_runs(gpu_test: str) -> None:
    """A ``gpu`` test runs its CPU twin's page text unchanged: CI, which has no GPU, checks it here.

    A block marked for the CPU test alone leaves the GPU script without it (a Fabric script with
    no ``fabric``), which only a GPU machine would find.
    """
    twin = gpu_test.removesuffix("_gpu")
    assert twin in globals(), f"{gpu_test} has no CPU twin {twin}"
    for lang in ("python", "json"):
        assert _marked(HERE + gpu_test, lang) == _marked(HERE + twin, lang), lang
