"""The default ``knn_func`` and ``kmeans_func`` of ``AccuracyCalculator``, with pytorch-metric-learning's signatures."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional.search import KNNBackend, knn

__all__ = ["ExactKNN", "KMeans", "KMeansFunc", "KNNFunc"]

#: ``knn_func(query, k, reference, ref_includes_query) -> (distances (Q, k), indices (Q, k))``.
KNNFunc = Callable[[Tensor, int, Tensor, bool], tuple[Tensor, Tensor]]
#: ``kmeans_func(x, n_clusters) -> (N,) cluster ids``.
KMeansFunc = Callable[[Tensor, int], Tensor]


def _empty_neighbours(n_query: int, device: torch.device) -> tuple[Tensor, Tensor]:
    return torch.zeros(n_query, 0, device=device), torch.zeros(n_query, 0, dtype=torch.long, device=device)


class ExactKNN:
    """Exact kNN with pytorch-metric-learning's ``knn_func`` signature (the default ``knn_func``).

    Squared Euclidean distances (as faiss' ``IndexFlatL2``), nearest first, ties by reference position.
    With ``ref_includes_query`` query i is reference row i and is left out of its own neighbours.
    ``k`` is capped at the number of candidates of a query.

    Args:
        backend: the :func:`~torchmetrics_retrieval.functional.knn` backend; None: ``"auto"`` (the faster
            backend for the situation; a reference that is the query set itself is searched symmetrically).
    """

    def __init__(self, backend: KNNBackend | None = None) -> None:
        self.backend = backend

    def __call__(
        self, query: Tensor, k: int, reference: Tensor | None = None, ref_includes_query: bool = False
    ) -> tuple[Tensor, Tensor]:
        reference = query if reference is None else reference
        own = torch.arange(query.shape[0], device=query.device) if ref_includes_query else None
        return self.search(query, k, reference, own)

    def search(self, query: Tensor, k: int, reference: Tensor, self_index: Tensor | None) -> tuple[Tensor, Tensor]:
        """Neighbours of every query, leaving out reference row ``self_index[i]`` for query i (-1: none)."""
        k = min(k, reference.shape[0] - (0 if self_index is None else 1))
        if k <= 0:
            return _empty_neighbours(query.shape[0], query.device)
        backend = self.backend or "auto"
        if self_index is not None and _is_same_set(query, reference, self_index):
            # the set against itself: lets knn compute each distance block once (symmetric search)
            found = knn(query, None, k, distance="sqeuclidean", backend=backend)
        else:
            found = knn(query, reference, k, distance="sqeuclidean", exclude_self=self_index, backend=backend)
        return found.distances, found.indices


def _is_same_set(query: Tensor, reference: Tensor, self_index: Tensor) -> bool:
    """Whether query i is reference row i for every i and there is no other reference row."""
    if query is reference:
        return True
    if query.shape != reference.shape:
        return False
    return bool(torch.equal(self_index, torch.arange(query.shape[0], device=query.device))) and torch.equal(
        query, reference
    )


class KMeans:
    """k-means with pytorch-metric-learning's ``kmeans_func`` signature (the default ``kmeans_func``).

    :func:`torchmetrics_retrieval.functional.clustering.kmeans` (faiss, 20 iterations) with a fixed seed.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def __call__(self, x: Tensor, n_clusters: int) -> Tensor:
        from torchmetrics_retrieval.functional.clustering import kmeans

        return kmeans(x, n_clusters, seed=self.seed)
