"""Rank side of the docs recipe tests: a tiny model, per-rank data, and a report of the weights.

A recipe script (assembled by tests/support/integration/recipes.py from a docs block) imports this module.
Every rank trains on different data, so ranks whose gradients are not averaged end with different
weights. `report` writes one JSON file per rank into $RECIPE_OUT: the world size the framework
saw, and digests of the parameters before and after one optimizer step.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

IN, OUT, BATCH = 4, 2, 8


def model() -> torch.nn.Linear:
    """Return the same small linear model on every rank."""
    torch.manual_seed(0)
    return torch.nn.Linear(IN, OUT)


def batch(rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return this rank's inputs and targets: different on every rank."""
    g = torch.Generator().manual_seed(
        1000 + (int(os.environ.get("RANK", "0")) if rank is None else rank)
    )
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def loss(module: torch.nn.Module, rank: int | None = None) -> torch.Tensor:
    """Return the mean squared error of `module` on this rank's batch."""
    x, y = batch(rank)
    device = next(module.parameters()).device
    return torch.nn.functional.mse_loss(module(x.to(device)), y.to(device))


def digest(params: Iterable[torch.Tensor]) -> str:
    """Return a digest of the parameters' exact values."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def report(world_size: int, before: str, after: str, **extra: Any) -> None:
    """Write this rank's record to $RECIPE_OUT/rank<RANK>.json."""
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "world_size": world_size, "before": before, "after": after, **extra}
    path = Path(os.environ["RECIPE_OUT"]) / f"rank{rank}.json"
    path.write_text(json.dumps(record), encoding="utf-8")


def lightning_parts() -> tuple[Any, Any]:
    """Return a LightningModule that records digests around its one step, and its datamodule."""
    import lightning as L  # noqa: N812 (Lightning's own spelling)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()
            self.before = self.after = ""

        def training_step(self, data: Any, index: int) -> torch.Tensor:
            return loss(self.net)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_start(self) -> None:
            self.before = digest(self.parameters())

        def on_train_batch_end(self, *args: Any) -> None:
            self.after = digest(self.parameters())
            self.trainer.should_stop = True  # one optimizer step is enough

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*batch()), BATCH)

    return Module(), Data()


def mmengine_parts() -> tuple[Any, Any]:
    """Return an mmengine BaseModel around `model()`, and a loader of this rank's one batch."""
    from mmengine.model import BaseModel

    class Model(BaseModel):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "loss") -> Any:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}

    data = torch.utils.data.TensorDataset(*batch())
    return Model(), torch.utils.data.DataLoader(data, batch_size=BATCH)


def hf_parts() -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """Return a 1-layer GPT-2 built from a config (no download), and its token dataset.

    The dataset is the same on every rank, as in a real job: the Trainer's distributed sampler
    gives each rank different samples, so ranks whose gradients are not averaged end with
    different weights. 32 samples of 8 tokens make two steps per epoch for 2 ranks of 8.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=64, bos_token_id=0, eos_token_id=0
    )
    tokens = torch.randint(
        0, config.vocab_size, (32, 8), generator=torch.Generator().manual_seed(1)
    )
    return GPT2LMHeadModel(config), [{"input_ids": t, "labels": t} for t in tokens]
