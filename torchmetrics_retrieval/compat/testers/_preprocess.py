"""What the testers do to labels and embeddings before the search: label ranks and levels, standardisation, PCA;
the sets of one search (``QueryAndReference``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import describe

__all__ = [
    "LabelLevel",
    "LabelRanks",
    "QueryAndReference",
    "SplitsToEval",
    "as_numpy",
    "check_level",
    "default_device",
    "identity",
    "pca_projection",
    "standardise",
]

SplitsToEval = list[tuple[str, list[str]]]
LabelLevel = int | str | Sequence[int]


class QueryAndReference(NamedTuple):
    """One evaluation's sets: ``set_reference_and_query``'s four tensors and ``ref_includes_query``'s answer."""

    query: Tensor
    query_labels: Tensor
    reference: Tensor
    reference_labels: Tensor
    ref_includes_query: bool


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def identity(x: Any) -> Any:
    return x


def standardise(x: Tensor) -> Tensor:
    """Zero mean and unit (unbiased) standard deviation per column."""
    return (x - x.mean(dim=0)) / x.std(dim=0)


def pca_projection(x: Tensor, dims: int) -> Tensor:
    """Projection of the centred rows on the ``dims`` leading principal axes (exact, float64)."""
    centred = (x - x.mean(dim=0)).double()
    covariance = centred.T @ centred / max(x.shape[0] - 1, 1)
    _, vectors = torch.linalg.eigh(covariance)  # ascending eigenvalues
    return (centred @ vectors[:, -dims:].flip(1)).to(x.dtype)


class LabelRanks:
    """``set_min_label_to_zero``: every label replaced by its rank among the dataset's labels of its level."""

    def __init__(self, dataset_labels: Any) -> None:
        labels = np.asarray(dataset_labels)
        columns = labels[:, None] if labels.ndim == 1 else labels
        self.levels = [np.unique(columns[:, h]) for h in range(columns.shape[1])]

    def __call__(self, labels: np.ndarray, level: int) -> np.ndarray:
        known = self.levels[level]
        ranks = np.searchsorted(known, labels).clip(max=len(known) - 1)
        if not np.array_equal(known[ranks], labels):
            unknown = labels[known[ranks] != labels][0]
            raise ValueError(f"`dataset_labels` must contain every label of the data, got label {unknown!r}.")
        return ranks.astype(np.int64)


def check_level(level: Any) -> None:
    if level == "all":
        return
    levels = level if isinstance(level, (list, tuple)) else [level]
    if not levels or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in levels):
        raise ValueError(
            f"`label_hierarchy_level` must be an int >= 0, a list of them, or 'all', got {describe(level)}."
        )


def as_numpy(x: Any) -> Any:
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else x
