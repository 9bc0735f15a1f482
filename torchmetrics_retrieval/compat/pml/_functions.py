"""pytorch-metric-learning's module-level helpers of ``accuracy_calculator``, same names and arguments."""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.pml._values import (
    EQUALITY,
    Accuracy,
    LabelComparison,
    custom_fn,
    hit_matrix,
    knn_hits,
    label_count_of,
    per_query_values,
    reduce_values,
    relevant_counts,
)
from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional.relevance import count_relevant

__all__ = [
    "get_label_match_counts",
    "get_lone_query_labels",
    "get_unique_labels",
    "maybe_get_avg_of_avgs",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "nan_accuracy",
    "precision_at_k",
    "r_precision",
    "try_getting_not_lone_labels",
]


def get_unique_labels(labels: Tensor) -> Tensor:
    """Distinct labels (rows for 2-D labels), sorted."""
    return torch.unique(labels, dim=0)


def maybe_get_avg_of_avgs(
    accuracy_per_sample: Tensor, sample_labels: Tensor, avg_of_avgs: bool, return_per_class: bool
) -> Accuracy:
    """Reduce per-query values: the mean, or the mean of per-label means, or the per-label means.

    Example:
        >>> maybe_get_avg_of_avgs(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), True, False)
        0.75
    """
    return reduce_values(accuracy_per_sample, sample_labels, avg_of_avgs, return_per_class)


def precision_at_k(
    knn_labels: Tensor,
    gt_labels: Tensor,
    k: int,
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Accuracy:
    """Mean over queries of (hits among the first k neighbours) / k.

    Args:
        knn_labels: ``(Q, K)`` (or ``(Q, K, L)``) labels of the neighbours, nearest first.
        gt_labels: ``query_labels[:, None]`` (``query_labels`` itself is accepted too).
        k: the cutoff (divides even when K < k, as pytorch-metric-learning does).

    Example:
        >>> precision_at_k(torch.tensor([[1, 2], [3, 3]]), torch.tensor([[1], [3]]), 2)
        0.75
    """
    hits = hit_matrix(gt_labels, knn_labels, label_comparison_fn)
    values = ranking.precision_at_k(hits, hits.sum(dim=1), k, mode="standard")
    return reduce_values(values, gt_labels, avg_of_avgs, return_per_class)


def r_precision(
    knn_labels: Tensor,
    gt_labels: Tensor,
    ref_includes_query: bool,
    label_counts: tuple[Tensor, Tensor],
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Accuracy:
    """Mean over queries of (hits among the first R neighbours) / min(R, K); R from ``label_counts``.

    Example:
        >>> counts = (torch.tensor([1, 2]), torch.tensor([3, 2]))
        >>> r_precision(torch.tensor([[1, 2], [1, 2]]), torch.tensor([[1], [2]]), True, counts)
        0.25
    """
    hits, n_relevant = knn_hits(gt_labels, knn_labels, label_counts, ref_includes_query, label_comparison_fn)
    return reduce_values(per_query_values("r_precision", hits, n_relevant), gt_labels, avg_of_avgs, return_per_class)


def mean_average_precision(
    knn_labels: Tensor,
    gt_labels: Tensor,
    ref_includes_query: bool,
    label_counts: tuple[Tensor, Tensor],
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
    at_r: bool = False,
) -> Accuracy:
    """Mean average precision within the K neighbours (``at_r=True``: within the first R), divided by R.

    Example:
        >>> counts = (torch.tensor([1]), torch.tensor([3]))
        >>> mean_average_precision(torch.tensor([[2, 1, 1]]), torch.tensor([[1]]), False, counts)
        0.38888...
    """
    hits, n_relevant = knn_hits(gt_labels, knn_labels, label_counts, ref_includes_query, label_comparison_fn)
    metric = "mean_average_precision_at_r" if at_r else "mean_average_precision"
    return reduce_values(per_query_values(metric, hits, n_relevant), gt_labels, avg_of_avgs, return_per_class)


def mean_reciprocal_rank(
    knn_labels: Tensor,
    gt_labels: Tensor,
    avg_of_avgs: bool = False,
    return_per_class: bool = False,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> Accuracy:
    """Mean of 1 / (rank of the first hit within the K neighbours), 0 without a hit.

    Example:
        >>> mean_reciprocal_rank(torch.tensor([[2, 1], [2, 2]]), torch.tensor([[1], [1]]))
        0.25
    """
    hits = hit_matrix(gt_labels, knn_labels, label_comparison_fn)
    return reduce_values(ranking.reciprocal_rank(hits), gt_labels, avg_of_avgs, return_per_class)


def get_label_match_counts(
    query_labels: Tensor, reference_labels: Tensor, label_comparison_fn: LabelComparison = EQUALITY
) -> tuple[Tensor, Tensor]:
    """``(distinct query labels, number of reference labels matching each)``.

    Example:
        >>> get_label_match_counts(torch.tensor([0, 0, 1]), torch.tensor([1, 1, 1, 2]))
        (tensor([0, 1]), tensor([0, 3]))
    """
    distinct = get_unique_labels(query_labels)
    counts = count_relevant(distinct, reference_labels, label_comparison_fn=custom_fn(label_comparison_fn))
    return distinct, counts


def get_lone_query_labels(
    query_labels: Tensor,
    label_counts: tuple[Tensor, Tensor],
    ref_includes_query: bool,
    label_comparison_fn: LabelComparison = EQUALITY,
) -> tuple[Tensor, Tensor]:
    """``(labels without any relevant reference, (Q,) bool mask of the queries that have one)``.

    Example (pytorch-metric-learning's documented case: 0 is a lone query label):
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> get_lone_query_labels(labels, get_label_match_counts(labels, torch.tensor([1, 1, 1, 2, 2])), False)
        (tensor([0]), tensor([False, False,  True,  True]))
    """
    distinct, _ = label_counts
    lone = relevant_counts(distinct, label_counts, ref_includes_query, label_comparison_fn) <= 0
    not_lone = label_count_of(query_labels, (distinct, (~lone).long())) > 0
    return distinct[lone], not_lone


def try_getting_not_lone_labels(
    knn_labels: Tensor, query_labels: Tensor, not_lone_query_mask: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """The rows of the queries that are not lone, or ``(None, None)`` when every query is lone."""
    if not bool(not_lone_query_mask.any()):
        return None, None
    return knn_labels[not_lone_query_mask], query_labels[not_lone_query_mask]


def nan_accuracy(unique_labels: Tensor, return_per_class: bool) -> Accuracy:
    """NaN, or one NaN per label with ``return_per_class``."""
    return [float("nan")] * len(unique_labels) if return_per_class else float("nan")
