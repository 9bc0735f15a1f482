"""Per-query values and their reductions, shared by ``AccuracyCalculator`` and the module-level helpers.

pytorch-metric-learning's definitions (every metric within the K retrieved neighbours) on top of the
functional core's hit matrix and ranking kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional.reduction import grouped_mean, masked_mean
from torchmetrics_retrieval.functional.relevance import relevance_matrix

__all__ = [
    "EQUALITY",
    "KNN_METRICS",
    "Accuracy",
    "LabelComparison",
    "custom_fn",
    "hit_matrix",
    "knn_hits",
    "label_count_of",
    "per_query_values",
    "reduce_values",
    "relevant_counts",
    "self_match",
]

#: The default label comparison (whole-row equality for 2-D labels, see the module docstring).
EQUALITY = torch.eq

Accuracy = float | list[float]
LabelComparison = Callable[[Tensor, Tensor], Tensor]

KNN_METRICS = (
    "precision_at_1",
    "mean_average_precision",
    "mean_average_precision_at_r",
    "r_precision",
    "mean_reciprocal_rank",
)


def custom_fn(label_comparison_fn: LabelComparison | None) -> LabelComparison | None:
    """The comparison to hand to the functional core: None for the default equality."""
    return None if label_comparison_fn is None or label_comparison_fn is EQUALITY else label_comparison_fn


def hit_matrix(gt_labels: Tensor, knn_labels: Tensor, label_comparison_fn: LabelComparison | None) -> Tensor:
    """(Q, K) hit matrix from pytorch-metric-learning's arguments.

    ``gt_labels`` is ``(Q, 1)`` / ``(Q, 1, L)`` (``query_labels[:, None]``, its convention) or ``(Q,)`` /
    ``(Q, L)``; ``knn_labels`` is ``(Q, K)`` / ``(Q, K, L)``.
    """
    if gt_labels.ndim == knn_labels.ndim:
        gt_labels = gt_labels[:, 0]
    n_query, k = knn_labels.shape[:2]
    retrieved = knn_labels.reshape(n_query * k, *knn_labels.shape[2:])
    positions = torch.arange(n_query * k, device=knn_labels.device).reshape(n_query, k)
    return relevance_matrix(gt_labels, retrieved, positions, label_comparison_fn=custom_fn(label_comparison_fn))


def self_match(labels: Tensor, label_comparison_fn: LabelComparison | None) -> Tensor:
    """(Q,) int64: 1 where a label matches itself (always, for the default equality)."""
    fn = custom_fn(label_comparison_fn)
    if fn is None:
        return torch.ones(labels.shape[0], dtype=torch.long, device=labels.device)
    return fn(labels, labels).reshape(labels.shape[0], -1).all(dim=1).long()


def label_count_of(labels: Tensor, label_counts: tuple[Tensor, Tensor]) -> Tensor:
    """(Q,) count of each label looked up in ``label_counts = (distinct labels, counts)``; 0 when absent."""
    distinct, counts = label_counts
    flat = labels.reshape(labels.shape[0], -1)
    keys = torch.cat([distinct.reshape(distinct.shape[0], -1).to(flat.dtype), flat])
    _, ids = torch.unique(keys, dim=0, return_inverse=True)
    table = torch.zeros(int(ids.max()) + 1, dtype=torch.long, device=labels.device)
    table[ids[: distinct.shape[0]]] = counts.long().to(labels.device)
    return table[ids[distinct.shape[0] :]]


def relevant_counts(
    labels: Tensor,
    label_counts: tuple[Tensor, Tensor],
    ref_includes_query: bool,
    label_comparison_fn: LabelComparison | None,
) -> Tensor:
    """R of every query from ``label_counts``: its label's count, minus its own row if it matches itself."""
    counts = label_count_of(labels, label_counts)
    return counts - self_match(labels, label_comparison_fn) if ref_includes_query else counts


def knn_hits(
    gt_labels: Tensor,
    knn_labels: Tensor,
    label_counts: tuple[Tensor, Tensor],
    ref_includes_query: bool,
    label_comparison_fn: LabelComparison | None,
) -> tuple[Tensor, Tensor]:
    """``(hit matrix, R of every query)`` from pytorch-metric-learning's arguments (:func:`hit_matrix`,
    :func:`relevant_counts`)."""
    hits = hit_matrix(gt_labels, knn_labels, label_comparison_fn)
    return hits, relevant_counts(gt_labels, label_counts, ref_includes_query, label_comparison_fn)


def per_query_values(metric: str, is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
    """The per-query value of a built-in kNN metric, pytorch-metric-learning's definition within K columns."""
    if metric == "precision_at_1":
        return ranking.precision_at_k(is_relevant, n_relevant, 1, mode="standard")
    if metric == "r_precision":  # divides by min(R, K), as pytorch-metric-learning does
        return ranking.r_precision(is_relevant, n_relevant.clamp(max=is_relevant.shape[1]))
    if metric == "mean_average_precision_at_r":
        return ranking.map_at_r(is_relevant, n_relevant)
    if metric == "mean_average_precision":
        return ranking.average_precision(is_relevant, n_relevant)
    if metric == "mean_reciprocal_rank":
        return ranking.reciprocal_rank(is_relevant)
    raise ValueError(f"`metric` must be one of {KNN_METRICS}, got {metric!r}.")


def reduce_values(values: Tensor, labels: Tensor, avg_of_avgs: bool, return_per_class: bool) -> Accuracy:
    """Mean (float), mean of per-label means (float) or per-label means in label order (list)."""
    values = values.to(torch.float64)
    everyone = torch.ones(values.shape[0], dtype=torch.bool, device=values.device)
    if avg_of_avgs or return_per_class:
        _, means, _ = grouped_mean(values, everyone, labels.reshape(labels.shape[0], -1))
        return [float(v) for v in means.tolist()] if return_per_class else float(means.mean())
    return float(masked_mean(values, everyone))
