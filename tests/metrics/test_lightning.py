"""EmbeddingMetrics and PCF in a MetricCollection inside a real Lightning Trainer (fit and validate), one process
and ddp_spawn on 2 CPUs.

The module calls ``self.val_metrics.update(embeddings, labels, indexes=...)`` on the collection (positional
arguments: PCF takes the labels and ignores them), logs ``self.log_dict(self.val_metrics.compute())`` at the end
of each validation epoch (EmbeddingMetrics sharded under ddp_spawn) and
saves the embeddings it produced (with their dataset indexes); the test recomputes the metrics from
those embeddings with the functional core and requires the logged values to be identical.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MetricCollection

from torchmetrics_retrieval.functional import pcf, retrieval_metrics
from torchmetrics_retrieval.metrics import PCF, EmbeddingMetrics
from torchmetrics_retrieval.metrics._sharded import embedding as sharded_embedding
from torchmetrics_retrieval.metrics._state import deduplicate

# metrics from each query's top K: under ddp_spawn EmbeddingMetrics(distributed="shard") runs sharded, each
# process keeping its own embeddings
OPTIONS: dict[str, Any] = {"cmc_top_k": (1, 5), "precision_top_k": (5,), "map_top_k": (5,), "map_at_r": True}
N_TRAIN = 1200  # the validation set has 1797 - 1200 = 597 samples: DistributedSampler pads one duplicate


def _counted_sharded_compute() -> list[int]:
    """Count the calls of the sharded path of ``EmbeddingMetrics.compute`` (looked up at call time): a fallback to
    gathering would give the same numbers, so the count is what shows that the sharded path ran."""
    calls: list[int] = []
    original = sharded_embedding.sharded_compute
    if not hasattr(original, "calls"):

        def counting(*args: Any) -> Any:
            counting.calls.append(1)  # type: ignore[attr-defined]
            return original(*args)

        counting.calls = calls  # type: ignore[attr-defined]
        sharded_embedding.sharded_compute = counting  # type: ignore[assignment]
    return sharded_embedding.sharded_compute.calls  # type: ignore[attr-defined,no-any-return]


class DigitsEmbedder(pl.LightningModule):
    """A tiny embedding network trained with a classification head; validation logs retrieval metrics."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 10)
        self.val_metrics = MetricCollection(
            {"ranking": EmbeddingMetrics(**OPTIONS, distributed="shard"), "spread": PCF(pcf_variance=(0.9,))},
            prefix="val/",
        )
        self.out_dir = out_dir
        self.seen: list[tuple[Tensor, Tensor, Tensor]] = []

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        _, x, y = batch
        return nn.functional.cross_entropy(self.head(self.embed(x)), y)

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        index, x, y = batch
        embeddings = self.embed(x)
        self.val_metrics.update(embeddings, y, indexes=index)
        self.seen.append((index, embeddings, y))

    def on_validation_epoch_start(self) -> None:
        _counted_sharded_compute()  # in the process that computes (ddp_spawn's children)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute())
        self.val_metrics.reset()
        index, embeddings, labels = (torch.cat(parts) for parts in zip(*self.seen, strict=True))
        stage = self.trainer.state.fn.value if self.trainer.state.fn else "none"
        torch.save((index, embeddings, labels), Path(self.out_dir) / f"{stage}_rank{self.global_rank}.pt")
        calls = len(_counted_sharded_compute())
        torch.save(calls, Path(self.out_dir) / f"{stage}_sharded_calls_rank{self.global_rank}.pt")
        self.seen = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _loaders() -> tuple[DataLoader, DataLoader]:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
    index = torch.arange(len(y))
    train = TensorDataset(index[:N_TRAIN], x[:N_TRAIN], y[:N_TRAIN])
    val = TensorDataset(index[N_TRAIN:], x[N_TRAIN:], y[N_TRAIN:])
    return DataLoader(train, batch_size=100, shuffle=True), DataLoader(val, batch_size=64)


def _direct(out_dir: Path, stage: str, world_size: int) -> dict[str, Tensor]:
    """The metrics recomputed from the saved embeddings: gather order, duplicates dropped, ordered by index."""
    parts = [torch.load(out_dir / f"{stage}_rank{rank}.pt") for rank in range(world_size)]
    index, embeddings, labels = (torch.cat(column) for column in zip(*parts, strict=True))
    assert index.unique().numel() == 1797 - N_TRAIN
    rows, _ = deduplicate({"embeddings": embeddings, "labels": labels}, index)
    assert rows["embeddings"] is not None and rows["labels"] is not None
    values = {
        **retrieval_metrics(rows["embeddings"], rows["labels"], **OPTIONS),
        "pcf/0.9": pcf(rows["embeddings"], (0.9,))[0],
    }
    return {f"val/{key}": value for key, value in values.items()}


def _assert_logged(logged: Mapping[str, Any], expected: dict[str, Tensor]) -> None:
    assert set(expected) <= set(logged)
    for key, value in expected.items():
        torch.testing.assert_close(torch.as_tensor(logged[key]).cpu(), value, rtol=0, atol=0, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "devices"), [("auto", 1), ("ddp_spawn", 2)], ids=["single-process", "ddp_spawn-2-cpus"]
)
def test_fit_and_validate_log_exact_metrics(strategy: str, devices: int, tmp_path: Path) -> None:
    pl.seed_everything(0, workers=True)
    train, val = _loaders()
    model = DigitsEmbedder(str(tmp_path))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=2,
        limit_train_batches=4,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers / sync_dist
        trainer.fit(model, train, val)
        _assert_logged(trainer.callback_metrics, _direct(tmp_path, "fit", devices))
        (validated,) = trainer.validate(model, val)
    expected = _direct(tmp_path, "validate", devices)
    _assert_logged(validated, expected)
    _assert_logged(trainer.callback_metrics, expected)
    # each validation epoch's compute() ran the sharded path under ddp_spawn (2 in fit, then 1), never on one process
    for rank in range(devices):
        for stage, epochs in (("fit", 2), ("validate", 1)):
            calls = torch.load(tmp_path / f"{stage}_sharded_calls_rank{rank}.pt")
            assert calls == (epochs if devices > 1 else 0), (stage, rank, calls)
    assert 0.5 < float(expected["val/cmc/1"]) <= 1.0  # the embedding learned something
