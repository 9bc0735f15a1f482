"""Clustering quality of embeddings: k-means (faiss) against the labels, scored by NMI and AMI.

:func:`clustering_scores` runs k-means with as many clusters as there are distinct labels and compares
the cluster assignment with the labels by scikit-learn's normalised and adjusted mutual information
(``normalized_mutual_info_score`` and ``adjusted_mutual_info_score`` with their default arithmetic
normalisation), as pytorch-metric-learning's ``AccuracyCalculator`` does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import (
    check_callable,
    check_embeddings,
    check_labels,
    check_positive_int,
    describe,
)

__all__ = ["KMeansFn", "clustering_scores", "kmeans"]

#: A k-means function: ``(embeddings (N, D), n_clusters) -> (N,) int64 cluster ids``.
KMeansFn = Callable[[Tensor, int], Tensor]


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int, got {describe(seed)}.")
    if not 0 <= seed < 2**31:
        raise ValueError(f"`seed` must be in [0, 2**31), got {seed}.")
    return seed


def kmeans(embeddings: Tensor, n_clusters: int, *, seed: int = 0, n_iter: int = 20, n_redo: int = 1) -> Tensor:
    """Cluster the rows with faiss' k-means (exact L2 assignment, every row used for training).

    Deterministic on CPU for a given ``seed``: faiss draws its initial centroids (random rows) from it.
    Lloyd's iterations can stop in a local optimum (two centroids in one cluster); ``n_redo > 1`` runs
    k-means that many times and keeps the lowest objective.

    Args:
        embeddings: ``(N, D)`` floating, finite (computed in float32 on CPU).
        n_clusters: number of clusters, ``1 <= n_clusters <= N``.
        seed: seed of faiss' random initialisation.
        n_iter: number of k-means iterations (>= 1).
        n_redo: number of runs from different initialisations (>= 1).

    Returns:
        ``(N,)`` int64 cluster id of each row, in ``[0, n_clusters)``, on the device of ``embeddings``.

    Example:
        >>> x = torch.tensor([[0.0], [0.1], [10.0], [10.1]])
        >>> ids = kmeans(x, 2)
        >>> bool(ids[0] == ids[1]) and bool(ids[2] == ids[3]) and bool(ids[0] != ids[2])
        True
    """
    check_embeddings("embeddings", embeddings)
    check_positive_int("n_clusters", n_clusters)
    check_positive_int("n_iter", n_iter)
    check_positive_int("n_redo", n_redo)
    seed = _check_seed(seed)
    if n_clusters > embeddings.shape[0]:
        raise ValueError(f"`n_clusters` must be at most the number of rows {embeddings.shape[0]}, got {n_clusters}.")
    return _kmeans_compute(embeddings, n_clusters, seed, n_iter=n_iter, n_redo=n_redo)


def _kmeans_compute(embeddings: Tensor, n_clusters: int, seed: int, *, n_iter: int, n_redo: int) -> Tensor:
    """:func:`kmeans` of checked arguments."""
    import faiss

    n, d = embeddings.shape
    x = np.ascontiguousarray(embeddings.detach().to("cpu", torch.float32).numpy())
    clustering = faiss.Clustering(d, n_clusters)
    clustering.niter = n_iter
    clustering.seed = seed
    clustering.nredo = n_redo
    clustering.max_points_per_centroid = n  # train on every row, no subsampling
    clustering.min_points_per_centroid = 1  # silence the warning about small clusters
    index = faiss.IndexFlatL2(d)
    clustering.train(x, index)
    _, assignment = index.search(x, 1)
    return torch.from_numpy(assignment[:, 0].astype(np.int64)).to(embeddings.device)


def _label_ids(labels: Tensor) -> Tensor:
    """Labels (1-D values or 2-D rows) as ids in ``[0, number of distinct labels)``."""
    _, ids = torch.unique(labels, dim=0 if labels.ndim == 2 else None, return_inverse=True)
    return ids


def clustering_scores(
    embeddings: Tensor,
    labels: Tensor,
    *,
    seed: int = 0,
    kmeans_fn: KMeansFn | None = None,
) -> dict[str, Tensor]:
    """NMI and AMI between the labels and a k-means clustering with one cluster per distinct label.

    Args:
        embeddings: ``(N, D)`` floating, finite.
        labels: ``(N,)`` labels, or ``(N, L)`` where each distinct row is a label; any dtype.
        seed: seed of :func:`kmeans`.
        kmeans_fn: a replacement for :func:`kmeans`, called as ``kmeans_fn(embeddings, n_clusters)``
            and returning ``(N,)`` integer cluster ids.

    Returns:
        ``{"nmi": tensor, "ami": tensor}``, 0-dim float32 tensors on the device of ``embeddings``.

    Example:
        >>> x = torch.tensor([[0.0], [0.1], [10.0], [10.1], [20.0], [20.2]])
        >>> clustering_scores(x, torch.tensor([5, 5, 7, 7, 9, 9]))
        {'nmi': tensor(1.), 'ami': tensor(1.)}
    """
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    check_embeddings("embeddings", embeddings)
    check_labels("labels", labels, embeddings.shape[0], "embeddings")
    seed = _check_seed(seed)
    check_callable("kmeans_fn", kmeans_fn)
    label_ids = _label_ids(labels).cpu().numpy()
    n_clusters = int(label_ids.max()) + 1
    if kmeans_fn is None:
        clusters = _kmeans_compute(embeddings, n_clusters, seed, n_iter=20, n_redo=1)
    else:
        clusters = kmeans_fn(embeddings, n_clusters)
        if not isinstance(clusters, Tensor) or clusters.shape != (embeddings.shape[0],):
            raise ValueError(
                f"`kmeans_fn` must return a tensor of shape ({embeddings.shape[0]},), got {describe(clusters)}."
            )
    cluster_ids = clusters.cpu().numpy()
    scores = {
        "nmi": normalized_mutual_info_score(label_ids, cluster_ids),
        "ami": adjusted_mutual_info_score(label_ids, cluster_ids),
    }
    return {name: torch.tensor(value, dtype=torch.float32, device=embeddings.device) for name, value in scores.items()}
