"""The model, data and training script of ``lightning_ddp_digits.ipynb``.

Lightning refuses ``strategy="ddp_spawn"`` inside a notebook kernel (its launcher must start from a script), and
a process started by ``spawn`` imports the classes it receives by module name, which a class defined in a
notebook does not have. So the training lives here and the notebook runs it as a script::

    python _digits_model.py LOG_ROOT

It trains on 2 CPU processes, logs the validation metrics of every epoch with a ``CSVLogger`` under
``LOG_ROOT/digits/version_0`` and saves the trained weights there as ``model.pt``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from torchmetrics_retrieval import EmbeddingMetrics

__all__ = ["DigitsEmbedder", "digits_loaders", "train"]

N_TRAIN = 1200  # the first 1200 images train the network; the other 597 are the validation set


def digits_loaders(batch_size: int = 64) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders of ``(dataset index, standardised pixels, label)`` batches.

    The pixels are standardised with the training images' mean and standard deviation. The dataset index
    travels with every sample, so the metric can put the validation set back in one order whatever the
    number of processes (and drop the duplicates that ``DistributedSampler`` pads with).
    """
    pixels, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(pixels, dtype=torch.float32), torch.tensor(labels)
    mean, std = x[:N_TRAIN].mean(dim=0), x[:N_TRAIN].std(dim=0).clamp_min(1e-3)  # some border pixels are always 0
    x = (x - mean) / std
    index = torch.arange(len(y))
    train = TensorDataset(index[:N_TRAIN], x[:N_TRAIN], y[:N_TRAIN])
    val = TensorDataset(index[N_TRAIN:], x[N_TRAIN:], y[N_TRAIN:])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=batch_size)


class DigitsEmbedder(pl.LightningModule):
    """An MLP 64 -> 128 -> 32 trained with a normalised softmax loss; validation logs retrieval metrics.

    The loss is a cross-entropy over cosine similarities: the embedding and one weight vector per class
    are scaled to unit length, and their dot products (times a temperature ``scale``) are the logits. It
    pulls each embedding towards its class direction, which is what a cosine retrieval needs.
    """

    def __init__(self, n_classes: int = 10, scale: float = 16.0, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
        self.class_directions = nn.Parameter(torch.randn(n_classes, 32))
        self.val_metrics = EmbeddingMetrics(cmc_top_k=(1, 5), map_at_r=True, distance="cosine", prefix="val/")

    def forward(self, x: Tensor) -> Tensor:
        return self.embed(x)

    def setup(self, stage: str) -> None:
        # runs in every process, spawned ones included: keep Lightning's advice about data-loader workers
        # and per-step logging out of the notebook's output
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*sync_dist=True.*")

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        _, x, y = batch
        embeddings = nn.functional.normalize(self(x), dim=1)
        directions = nn.functional.normalize(self.class_directions, dim=1)
        loss = nn.functional.cross_entropy(self.hparams.scale * embeddings @ directions.T, y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        index, x, y = batch
        self.val_metrics.update(self(x), y, indexes=index)

    def on_validation_epoch_end(self) -> None:
        # compute() gathers every process's embeddings: each process logs the same, exact values
        self.log_dict(self.val_metrics.compute())
        self.val_metrics.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def train(log_root: str | Path, max_epochs: int = 5) -> CSVLogger:
    """Fit a ``DigitsEmbedder`` on 2 CPU processes (``ddp_spawn``); returns the logger (its ``log_dir`` holds
    ``metrics.csv`` and the weights ``model.pt``)."""
    pl.seed_everything(0, verbose=False)
    logger = CSVLogger(log_root, name="digits", version=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=max_epochs,
        logger=logger,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = DigitsEmbedder()
    train_loader, val_loader = digits_loaders()
    trainer.fit(model, train_loader, val_loader)
    # ddp_spawn hands rank 0's trained weights back to this process
    torch.save(model.state_dict(), Path(logger.log_dir) / "model.pt")
    print(f"trained {max_epochs} epochs on {trainer.world_size} processes ({trainer.strategy.__class__.__name__})")
    return logger


if __name__ == "__main__":
    train(sys.argv[1])
