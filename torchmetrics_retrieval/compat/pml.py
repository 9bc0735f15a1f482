"""pytorch-metric-learning's ``AccuracyCalculator`` (2.x API), computed by :mod:`torchmetrics_retrieval.functional`.

Swap the import and keep the code::

    # from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from torchmetrics_retrieval.compat.pml import AccuracyCalculator

    calculator = AccuracyCalculator(k="max_bin_count", exclude=("NMI", "AMI"))
    accuracies = calculator.get_accuracy(query, query_labels, reference, reference_labels, ref_includes_query=False)

The constructor, ``get_accuracy``, the metric names, the result (a dict of Python floats, or of lists
with ``return_per_class=True``), the validation errors and the extension mechanism (``calculate_<name>``
methods listed by ``requires_knn`` / ``requires_clustering``, called with the same keyword arguments)
are pytorch-metric-learning's. The search is an exact kNN (:func:`~torchmetrics_retrieval.functional.knn`,
squared Euclidean distances like faiss' ``IndexFlatL2``), hits come from
:func:`~torchmetrics_retrieval.functional.relevance_matrix` and
:func:`~torchmetrics_retrieval.functional.count_relevant`, values from the ranking kernels and
averages from :mod:`~torchmetrics_retrieval.functional.reduction`.

The numbers are pytorch-metric-learning's, quirks included: every metric is computed within the k
retrieved neighbours (``mean_reciprocal_rank`` is 0 for a query whose first hit lies beyond k,
``mean_average_precision`` divides the precision summed over the k neighbours by R);
``r_precision`` divides by min(R, k); queries whose label has no other match in the reference set
("lone" queries) are left out of every kNN metric, and a metric is NaN when every query is lone.

Where pytorch-metric-learning is wrong by DESIGN.md section 3, this module follows section 3:

* Labels keep their dtype (pytorch-metric-learning casts them to float32, so int labels above 2**24
  collide and float labels are rounded).
* R, the number of relevant references of a query, is counted exactly: with ``ref_includes_query``
  the query's own row is subtracted only if the comparison function matches a label with itself
  (pytorch-metric-learning always subtracts 1, which is off by one for non-reflexive functions).
* 2-D labels with the default comparison match when the whole row is equal (pytorch-metric-learning's
  default ``torch.eq`` compares column by column and averages the columns in some metrics).
* The query's own row is removed from its neighbours by position, before the search (never by dropping
  "the first neighbour", wrong when duplicates sit at distance 0); equal distances are ordered by
  reference position.
* With the 1.x call (``embeddings_come_from_same_source=True``) the query may be any subset of the
  reference, as 1.x allowed: each query row is matched to a reference row with exactly the same
  embedding and label, the j-th repeat of a row among the queries to the j-th occurrence of that row in
  the reference. (The 2.x ``ref_includes_query=True`` requires, like pytorch-metric-learning, that the
  query set be the first rows of the reference set; query i is then reference row i.)
* ``mean_reciprocal_rank`` alone works (pytorch-metric-learning forgets it in ``requires_knn`` and
  crashes); padding slots of a search asking for more neighbours than there are references are
  dropped (k is capped at the number of candidates) instead of being read as the last reference's label.
* Metric names passed to ``get_accuracy`` are checked (pytorch-metric-learning ignores typos silently).

Warnings that pytorch-metric-learning writes to its logger are issued with :func:`warnings.warn`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional._checks import check_embeddings, describe
from torchmetrics_retrieval.functional.search import KNNBackend, knn
from torchmetrics_retrieval.functional.reduction import grouped_mean, masked_mean
from torchmetrics_retrieval.functional.relevance import count_relevant, relevance_matrix

__all__ = [
    "EQUALITY",
    "AccuracyCalculator",
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

#: The default label comparison (whole-row equality for 2-D labels, see the module docstring).
EQUALITY = torch.eq

Accuracy = float | list[float]
LabelComparison = Callable[[Tensor, Tensor], Tensor]
#: ``knn_func(query, k, reference, ref_includes_query) -> (distances (Q, k), indices (Q, k))``.
KNNFunc = Callable[[Tensor, int, Tensor, bool], tuple[Tensor, Tensor]]
#: ``kmeans_func(x, n_clusters) -> (N,) cluster ids``.
KMeansFunc = Callable[[Tensor, int], Tensor]

_KNN_METRICS = (
    "precision_at_1",
    "mean_average_precision",
    "mean_average_precision_at_r",
    "r_precision",
    "mean_reciprocal_rank",
)


# ----------------------------------------------------------------------------------------------------------------------
# per-query values and reductions shared by the methods and the module-level helpers
# ----------------------------------------------------------------------------------------------------------------------


def _custom(label_comparison_fn: LabelComparison | None) -> LabelComparison | None:
    """The comparison to hand to the functional core: None for the default equality."""
    return None if label_comparison_fn is None or label_comparison_fn is EQUALITY else label_comparison_fn


def _hits(gt_labels: Tensor, knn_labels: Tensor, label_comparison_fn: LabelComparison | None) -> Tensor:
    """(Q, K) hit matrix from pytorch-metric-learning's arguments.

    ``gt_labels`` is ``(Q, 1)`` / ``(Q, 1, L)`` (``query_labels[:, None]``, its convention) or ``(Q,)`` /
    ``(Q, L)``; ``knn_labels`` is ``(Q, K)`` / ``(Q, K, L)``.
    """
    if gt_labels.ndim == knn_labels.ndim:
        gt_labels = gt_labels[:, 0]
    n_query, k = knn_labels.shape[:2]
    retrieved = knn_labels.reshape(n_query * k, *knn_labels.shape[2:])
    positions = torch.arange(n_query * k, device=knn_labels.device).reshape(n_query, k)
    return relevance_matrix(gt_labels, retrieved, positions, label_comparison_fn=_custom(label_comparison_fn))


def _self_match(labels: Tensor, label_comparison_fn: LabelComparison | None) -> Tensor:
    """(Q,) int64: 1 where a label matches itself (always, for the default equality)."""
    fn = _custom(label_comparison_fn)
    if fn is None:
        return torch.ones(labels.shape[0], dtype=torch.long, device=labels.device)
    return fn(labels, labels).reshape(labels.shape[0], -1).all(dim=1).long()


def _counts_of(labels: Tensor, label_counts: tuple[Tensor, Tensor]) -> Tensor:
    """(Q,) count of each label looked up in ``label_counts = (distinct labels, counts)``; 0 when absent."""
    distinct, counts = label_counts
    flat = labels.reshape(labels.shape[0], -1)
    keys = torch.cat([distinct.reshape(distinct.shape[0], -1).to(flat.dtype), flat])
    _, ids = torch.unique(keys, dim=0, return_inverse=True)
    table = torch.zeros(int(ids.max()) + 1, dtype=torch.long, device=labels.device)
    table[ids[: distinct.shape[0]]] = counts.long().to(labels.device)
    return table[ids[distinct.shape[0] :]]


def _relevant_counts(
    labels: Tensor,
    label_counts: tuple[Tensor, Tensor],
    ref_includes_query: bool,
    label_comparison_fn: LabelComparison | None,
) -> Tensor:
    """R of every query from ``label_counts``: its label's count, minus its own row if it matches itself."""
    counts = _counts_of(labels, label_counts)
    return counts - _self_match(labels, label_comparison_fn) if ref_includes_query else counts


def _per_query(metric: str, is_relevant: Tensor, n_relevant: Tensor) -> Tensor:
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
    raise ValueError(f"`metric` must be one of {_KNN_METRICS}, got {metric!r}.")


def _reduce(values: Tensor, labels: Tensor, avg_of_avgs: bool, return_per_class: bool) -> Accuracy:
    """Mean (float), mean of per-label means (float) or per-label means in label order (list)."""
    values = values.to(torch.float64)
    everyone = torch.ones(values.shape[0], dtype=torch.bool, device=values.device)
    if avg_of_avgs or return_per_class:
        _, means, _ = grouped_mean(values, everyone, labels.reshape(labels.shape[0], -1))
        return [float(v) for v in means.tolist()] if return_per_class else float(means.mean())
    return float(masked_mean(values, everyone))


# ----------------------------------------------------------------------------------------------------------------------
# module-level helpers with pytorch-metric-learning's names and arguments
# ----------------------------------------------------------------------------------------------------------------------


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
    return _reduce(accuracy_per_sample, sample_labels, avg_of_avgs, return_per_class)


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
    hits = _hits(gt_labels, knn_labels, label_comparison_fn)
    values = ranking.precision_at_k(hits, hits.sum(dim=1), k, mode="standard")
    return _reduce(values, gt_labels, avg_of_avgs, return_per_class)


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
    hits = _hits(gt_labels, knn_labels, label_comparison_fn)
    n_relevant = _relevant_counts(gt_labels, label_counts, ref_includes_query, label_comparison_fn)
    return _reduce(_per_query("r_precision", hits, n_relevant), gt_labels, avg_of_avgs, return_per_class)


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
    hits = _hits(gt_labels, knn_labels, label_comparison_fn)
    n_relevant = _relevant_counts(gt_labels, label_counts, ref_includes_query, label_comparison_fn)
    metric = "mean_average_precision_at_r" if at_r else "mean_average_precision"
    return _reduce(_per_query(metric, hits, n_relevant), gt_labels, avg_of_avgs, return_per_class)


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
    hits = _hits(gt_labels, knn_labels, label_comparison_fn)
    return _reduce(ranking.reciprocal_rank(hits), gt_labels, avg_of_avgs, return_per_class)


def get_label_match_counts(
    query_labels: Tensor, reference_labels: Tensor, label_comparison_fn: LabelComparison = EQUALITY
) -> tuple[Tensor, Tensor]:
    """``(distinct query labels, number of reference labels matching each)``.

    Example:
        >>> get_label_match_counts(torch.tensor([0, 0, 1]), torch.tensor([1, 1, 1, 2]))
        (tensor([0, 1]), tensor([0, 3]))
    """
    distinct = get_unique_labels(query_labels)
    counts = count_relevant(distinct, reference_labels, label_comparison_fn=_custom(label_comparison_fn))
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
    lone = _relevant_counts(distinct, label_counts, ref_includes_query, label_comparison_fn) <= 0
    not_lone = _counts_of(query_labels, (distinct, (~lone).long())) > 0
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


# ----------------------------------------------------------------------------------------------------------------------
# default search and clustering with pytorch-metric-learning's call signatures
# ----------------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------------
# input handling
# ----------------------------------------------------------------------------------------------------------------------


def _as_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, Tensor):
        return value
    raise TypeError(f"`{name}` must be a torch.Tensor or a numpy array, got {describe(value)}.")


def _embeddings(name: str, value: Any, device: torch.device) -> Tensor:
    """Embeddings as float32 on ``device`` (pytorch-metric-learning computes in float32 too)."""
    tensor = _as_tensor(name, value)
    if tensor.ndim == 2 and tensor.dtype != torch.float32:
        tensor = tensor.float()
    return check_embeddings(name, tensor.to(device))


def _labels(name: str, value: Any, n_rows: int, rows_name: str, device: torch.device) -> Tensor:
    """Labels on ``device`` in their own dtype, one per embedding."""
    tensor = _as_tensor(name, value)
    if tensor.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be 1-D or 2-D, got {describe(tensor)}.")
    if tensor.shape[0] != n_rows:
        raise ValueError(
            f"embeddings and labels must have the same length: `{rows_name}` has {n_rows} rows, "
            f"`{name}` is {describe(tensor)}."
        )
    return tensor.to(device)


def _v1_order(query: Any, second: Any, third: Any, fourth: Any) -> bool:
    """Whether positional arguments follow 1.x's ``(query, reference, query_labels, reference_labels)``.

    Decided by shapes: the second argument is a floating 2-D array of the query's width, the third has one
    row per query and the fourth one per reference row, and the 2.x reading does not fit as well.
    """
    shaped = all(hasattr(x, "shape") and hasattr(x, "dtype") for x in (query, second, third, fourth))
    if not shaped or second.ndim != 2 or query.ndim != 2 or second.shape[1] != query.shape[1]:
        return False
    floating = (
        torch.is_floating_point(second) if isinstance(second, Tensor) else np.issubdtype(second.dtype, np.floating)
    )
    v1 = floating and len(third) == len(query) and len(fourth) == len(second)
    v2 = (
        len(second) == len(query) and third.ndim == 2 and third.shape[1] == query.shape[1] and len(fourth) == len(third)
    )
    return bool(v1 and not v2)


def _is_prefix(query: Tensor, query_labels: Tensor, reference: Tensor, reference_labels: Tensor) -> bool:
    """pytorch-metric-learning's rule: the queries are the first rows of the reference set."""
    n = query.shape[0]
    if reference.shape[0] < n or reference_labels.shape[1:] != query_labels.shape[1:]:
        return False
    return bool(torch.allclose(query, reference[:n])) and bool((query_labels == reference_labels[:n]).all())


def _row_ids(rows: Tensor) -> Tensor:
    return torch.unique(rows.reshape(rows.shape[0], -1), dim=0, return_inverse=True)[1]


def _occurrence(keys: Tensor) -> Tensor:
    """For every entry, how many earlier entries have the same key (0 for a first occurrence)."""
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    starts = torch.ones_like(sorted_keys, dtype=torch.bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    positions = torch.arange(keys.shape[0], device=keys.device)
    group_start = torch.cummax(torch.where(starts, positions, 0), dim=0).values
    rank = torch.empty_like(positions)
    rank[order] = positions - group_start
    return rank


def _locate_rows(query: Tensor, query_labels: Tensor, reference: Tensor, reference_labels: Tensor) -> Tensor:
    """Reference position of every query row: same embedding and label, j-th repeat to j-th occurrence."""
    n = query.shape[0]
    embedding_ids = _row_ids(torch.cat([query, reference]))
    label_ids = _row_ids(torch.cat([query_labels, reference_labels.to(query_labels.dtype)]))
    row_ids = embedding_ids * (int(label_ids.max()) + 1) + label_ids
    keys = torch.cat([_occurrence(row_ids[:n]), _occurrence(row_ids[n:])]) * (int(row_ids.max()) + 1) + row_ids
    reference_keys, order = torch.sort(keys[n:])
    where = torch.searchsorted(reference_keys, keys[:n]).clamp(max=max(reference_keys.shape[0] - 1, 0))
    found = reference_keys[where] == keys[:n]
    if not bool(found.all()):
        missing = int(torch.nonzero(~found)[0])
        raise ValueError(
            "With `embeddings_come_from_same_source=True` every query must be a row of `reference` (same embedding "
            f"and label); query row {missing} is not."
        )
    return order[where]


class _Prepared(NamedTuple):
    """Hits of the current search, reused by the built-in metrics when they get the same tensors."""

    knn_labels: Tensor
    query_labels: Tensor
    is_relevant: Tensor
    n_relevant: Tensor


# ----------------------------------------------------------------------------------------------------------------------
# the calculator
# ----------------------------------------------------------------------------------------------------------------------


class AccuracyCalculator:
    """pytorch-metric-learning's ``AccuracyCalculator`` (same constructor, methods and numbers).

    Metrics (every ``calculate_<name>`` method; all of them by default, in alphabetical order):
    ``AMI``, ``NMI`` (k-means of the queries with one cluster per distinct query label, against the query
    labels, scikit-learn's scores), ``mean_average_precision``, ``mean_average_precision_at_r``,
    ``mean_reciprocal_rank``, ``precision_at_1``, ``r_precision``. See the module docstring for the exact
    definitions and the points where DESIGN.md section 3 is followed instead of pytorch-metric-learning.

    Args:
        include: names of the metrics to compute (empty: all).
        exclude: names of the metrics not to compute.
        avg_of_avgs: average the per-query values per query label, then average the labels.
        return_per_class: return, for every metric, the list of per-label averages (labels in sorted order).
        k: neighbours retrieved: None (every reference), an int > 0, or ``"max_bin_count"`` (the largest number
            of references matching a query label, minus 1 when ``ref_includes_query``). An int below that
            count makes ``r_precision`` and ``mean_average_precision_at_r`` wrong, with a warning.
        label_comparison_fn: ``fn(query_labels[:, None], knn_labels) -> bool`` of the broadcast shape;
            labels may then be 2-D or floats. Clustering metrics must be excluded.
        device: where to compute (default: CUDA if available, else CPU).
        knn_func: ``knn_func(query, k, reference, ref_includes_query) -> (distances, indices)``, removing the
            query itself when ``ref_includes_query`` (default: :class:`ExactKNN`).
        kmeans_func: ``kmeans_func(x, n_clusters) -> (N,) cluster ids`` (default: :class:`KMeans`).

    Raises:
        TypeError: ``include``/``exclude`` not a tuple or list.
        ValueError: an unknown metric name; ``avg_of_avgs`` and ``return_per_class`` both True; a bad ``k``.
        NotImplementedError: a clustering metric with a custom ``label_comparison_fn``.

    Example:
        >>> query = torch.tensor([[0.0, 0.0], [0.0, 1.0], [5.0, 5.0], [5.0, 6.0], [0.0, 2.5]])
        >>> labels = torch.tensor([0, 0, 1, 1, 1])
        >>> calculator = AccuracyCalculator(exclude=("NMI", "AMI"), device=torch.device("cpu"))
        >>> {name: round(value, 4) for name, value in calculator.get_accuracy(query, labels).items()}
        {'mean_average_precision': 0.8833, 'mean_average_precision_at_r': 0.8, 'mean_reciprocal_rank': 0.8667, \
'precision_at_1': 0.8, 'r_precision': 0.8}
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: int | str | None = None,
        label_comparison_fn: LabelComparison | None = None,
        device: torch.device | str | None = None,
        knn_func: KNNFunc | None = None,
        kmeans_func: KMeansFunc | None = None,
    ) -> None:
        self.function_keyword = "calculate_"
        names = [name for name in dir(self) if name.startswith(self.function_keyword)]
        self.original_function_dict: dict[str, Callable[..., Any]] = {
            name[len(self.function_keyword) :]: getattr(self, name) for name in names
        }
        self.check_primary_metrics(include, exclude)
        self.original_function_dict = self.get_function_dict(include, exclude)
        self.curr_function_dict = self.get_function_dict()

        if avg_of_avgs and return_per_class:
            raise ValueError("avg_of_avgs and return_per_class are mutually exclusive")
        self.avg_of_avgs = avg_of_avgs
        self.return_per_class = return_per_class

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.knn_func: KNNFunc = ExactKNN() if knn_func is None else knn_func
        self.kmeans_func: KMeansFunc = KMeans() if kmeans_func is None else kmeans_func

        valid_int = isinstance(k, int) and not isinstance(k, bool) and k > 0
        if not (valid_int or k is None or k == "max_bin_count"):
            raise ValueError(f"k must be an integer greater than 0, or None, or 'max_bin_count'; got `k`={k!r}.")
        self.k = k

        if label_comparison_fn is not None:
            if not callable(label_comparison_fn):
                raise TypeError(f"`label_comparison_fn` must be callable or None, got {describe(label_comparison_fn)}.")
            if any(name in self.requires_clustering() for name in self.get_curr_metrics()):
                raise NotImplementedError("Unsupported: clustering + custom label comparison")
            self.label_comparison_fn: LabelComparison = label_comparison_fn
        else:
            self.label_comparison_fn = EQUALITY
        self._prepared: _Prepared | None = None

    # --- metric selection ---------------------------------------------------------------------------------------------

    def get_function_dict(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> dict[str, Any]:
        """The metric functions selected by ``include``/``exclude`` among those chosen at construction."""
        chosen = list(include) if len(include) else list(self.original_function_dict)
        return {name: fn for name, fn in self.original_function_dict.items() if name in chosen and name not in exclude}

    def get_curr_metrics(self) -> list[str]:
        """Names of the metrics the next (or last) ``get_accuracy`` computes."""
        return list(self.curr_function_dict)

    def requires_clustering(self) -> list[str]:
        """Metrics that receive ``cluster_labels``; extend it in a subclass for custom metrics."""
        return ["NMI", "AMI"]

    def requires_knn(self) -> list[str]:
        """Metrics that receive the kNN keyword arguments; extend it in a subclass for custom metrics."""
        return list(_KNN_METRICS)

    def check_primary_metrics(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        """``include`` and ``exclude`` must be tuples or lists of known metric names."""
        known = list(self.original_function_dict)
        for name, value in (("include", include), ("exclude", exclude)):
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"Arguments must be of type tuple, not {type(value)} (`{name}`={value!r}).")
            if not set(value) <= set(known):
                raise ValueError(f"Primary metrics must be one or more of: {known}. Got `{name}`={value!r}.")

    def description(self) -> str:
        """Suffix the testers add to their record names."""
        return "avg_of_avgs" if self.avg_of_avgs else ""

    # --- clustering metrics -------------------------------------------------------------------------------------------

    def get_cluster_labels(self, query: Tensor, query_labels: Tensor, **kwargs: Any) -> Tensor:
        """``kmeans_func(query, number of distinct query labels)``."""
        return self.kmeans_func(query, int(torch.unique(query_labels, dim=0).shape[0]))

    def calculate_NMI(self, query_labels: Tensor, cluster_labels: Tensor, **kwargs: Any) -> float:
        """Normalised mutual information between query labels and clusters (scikit-learn)."""
        from sklearn.metrics import normalized_mutual_info_score

        return float(normalized_mutual_info_score(_row_ids(query_labels).cpu().numpy(), _numpy(cluster_labels)))

    def calculate_AMI(self, query_labels: Tensor, cluster_labels: Tensor, **kwargs: Any) -> float:
        """Adjusted mutual information between query labels and clusters (scikit-learn)."""
        from sklearn.metrics import adjusted_mutual_info_score

        return float(adjusted_mutual_info_score(_row_ids(query_labels).cpu().numpy(), _numpy(cluster_labels)))

    # --- kNN metrics --------------------------------------------------------------------------------------------------

    def _knn_metric(
        self,
        metric: str,
        knn_labels: Tensor,
        query_labels: Tensor,
        not_lone_query_mask: Tensor,
        label_counts: tuple[Tensor, Tensor],
        ref_includes_query: bool,
    ) -> Accuracy:
        if not bool(not_lone_query_mask.any()):
            return nan_accuracy(label_counts[0], self.return_per_class)
        prepared = self._prepared
        if prepared is not None and prepared.knn_labels is knn_labels and prepared.query_labels is query_labels:
            is_relevant, n_relevant = prepared.is_relevant, prepared.n_relevant
        else:  # called with other tensors (e.g. by a subclass): pytorch-metric-learning's inputs only
            is_relevant = _hits(query_labels, knn_labels, self.label_comparison_fn)
            n_relevant = _relevant_counts(query_labels, label_counts, ref_includes_query, self.label_comparison_fn)
        keep = not_lone_query_mask
        values = _per_query(metric, is_relevant[keep], n_relevant[keep])
        return _reduce(values, query_labels[keep], self.avg_of_avgs, self.return_per_class)

    def calculate_precision_at_1(
        self, knn_labels: Tensor, query_labels: Tensor, not_lone_query_mask: Tensor, label_counts: Any, **kwargs: Any
    ) -> Accuracy:
        """Fraction of queries whose nearest neighbour is relevant."""
        ref = bool(kwargs.get("ref_includes_query", False))
        return self._knn_metric("precision_at_1", knn_labels, query_labels, not_lone_query_mask, label_counts, ref)

    def calculate_mean_average_precision_at_r(
        self,
        knn_labels: Tensor,
        query_labels: Tensor,
        not_lone_query_mask: Tensor,
        ref_includes_query: bool,
        label_counts: Any,
        **kwargs: Any,
    ) -> Accuracy:
        """MAP@R ("A Metric Learning Reality Check", 3.2), within the k neighbours."""
        return self._knn_metric(
            "mean_average_precision_at_r",
            knn_labels,
            query_labels,
            not_lone_query_mask,
            label_counts,
            ref_includes_query,
        )

    def calculate_mean_average_precision(
        self,
        knn_labels: Tensor,
        query_labels: Tensor,
        not_lone_query_mask: Tensor,
        ref_includes_query: bool,
        label_counts: Any,
        **kwargs: Any,
    ) -> Accuracy:
        """Precision at every hit within the k neighbours, summed and divided by R."""
        return self._knn_metric(
            "mean_average_precision", knn_labels, query_labels, not_lone_query_mask, label_counts, ref_includes_query
        )

    def calculate_mean_reciprocal_rank(
        self, knn_labels: Tensor, query_labels: Tensor, not_lone_query_mask: Tensor, label_counts: Any, **kwargs: Any
    ) -> Accuracy:
        """1 / rank of the first hit within the k neighbours (0 without one)."""
        ref = bool(kwargs.get("ref_includes_query", False))
        return self._knn_metric(
            "mean_reciprocal_rank", knn_labels, query_labels, not_lone_query_mask, label_counts, ref
        )

    def calculate_r_precision(
        self,
        knn_labels: Tensor,
        query_labels: Tensor,
        not_lone_query_mask: Tensor,
        ref_includes_query: bool,
        label_counts: Any,
        **kwargs: Any,
    ) -> Accuracy:
        """Hits among the first R neighbours over min(R, k)."""
        return self._knn_metric(
            "r_precision", knn_labels, query_labels, not_lone_query_mask, label_counts, ref_includes_query
        )

    # --- evaluation ---------------------------------------------------------------------------------------------------

    def determine_k(self, bin_counts: Tensor, num_reference_embeddings: int, ref_includes_query: bool) -> int:
        """Neighbours to retrieve (pytorch-metric-learning's rule, with its warning for a k too small)."""
        self_count = int(ref_includes_query)
        max_bin_count = int(bin_counts.max()) if bin_counts.numel() else 0
        if self.k == "max_bin_count":
            return max_bin_count - self_count
        if self.k is None:
            return num_reference_embeddings - self_count
        assert isinstance(self.k, int)
        wrong = {"r_precision", "mean_average_precision_at_r"} & set(self.get_curr_metrics())
        if self.k < max_bin_count and wrong:
            warnings.warn(
                f"You are computing {wrong}, but the value for k ({self.k}) is less than the max bin count "
                f"({max_bin_count}) so the values for these metrics will be incorrect. To fix this, set "
                f"k='max_bin_count'. If you're looking for MAP@{self.k} instead of MAP@R, then you should use "
                "'mean_average_precision' rather than mean_average_precision_at_r",
                UserWarning,
                stacklevel=4,
            )
        return self.k

    def get_accuracy(
        self,
        query: Any,
        query_labels: Any,
        reference: Any = None,
        reference_labels: Any = None,
        ref_includes_query: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        *,
        embeddings_come_from_same_source: bool | None = None,
    ) -> dict[str, Any]:
        """Compute the selected metrics of ``query`` retrieving from ``reference``.

        Args:
            query: ``(Nq, D)`` torch or numpy embeddings.
            query_labels: ``(Nq,)`` labels (``(Nq, L)`` or floats with a custom ``label_comparison_fn``).
            reference: ``(Nr, D)`` embeddings searched; None: the queries themselves (``ref_includes_query``).
            reference_labels: ``(Nr,)`` labels of ``reference`` (with ``reference`` only).
            ref_includes_query: the queries are the first ``Nq`` rows of ``reference``; query i is then left
                out of its own neighbours.
            include: metrics to compute this time, among those chosen at construction (empty: all of them).
            exclude: metrics to skip this time.
            embeddings_come_from_same_source: 1.x name of ``ref_includes_query`` (deprecated). A 1.x positional
                call ``(query, reference, query_labels, reference_labels, same_source)`` is recognised by the
                shapes of its arguments and also accepted with a ``DeprecationWarning``; in both 1.x forms the
                queries may be any subset of the reference (see the module docstring).

        Returns:
            ``{metric name: float}`` (a list of per-label floats with ``return_per_class``), in the
            order of the metric names.

        Raises:
            TypeError, ValueError: malformed inputs, naming the argument; ``ref_includes_query=True`` while the
                queries are not the first rows of ``reference``; unknown metric names.
        """
        legacy = False
        if embeddings_come_from_same_source is not None:
            warnings.warn(
                "`embeddings_come_from_same_source` is deprecated; use `ref_includes_query`.", DeprecationWarning, 2
            )
            ref_includes_query, legacy = embeddings_come_from_same_source, True
        if _v1_order(query, query_labels, reference, reference_labels):
            warnings.warn(
                "get_accuracy(query, reference, query_labels, reference_labels, ...) is the 1.x argument order; use "
                "get_accuracy(query, query_labels, reference, reference_labels, ref_includes_query).",
                DeprecationWarning,
                2,
            )
            query_labels, reference, legacy = reference, query_labels, True
        self._check_names("include", include)
        self._check_names("exclude", exclude)
        q, ql, r, rl, own, ref_includes_query = self._inputs(
            query, query_labels, reference, reference_labels, ref_includes_query, legacy
        )
        self.curr_function_dict = self.get_function_dict(include, exclude)
        kwargs: dict[str, Any] = {
            "query": q,
            "reference": r,
            "query_labels": ql,
            "reference_labels": rl,
            "ref_includes_query": ref_includes_query,
            "label_comparison_fn": self.label_comparison_fn,
        }
        if legacy:  # the 1.x name of ref_includes_query, for 1.x custom metrics
            kwargs["embeddings_come_from_same_source"] = ref_includes_query
        metrics = self.get_curr_metrics()
        try:
            if any(name in self.requires_knn() for name in metrics):
                kwargs.update(self._knn_kwargs(q, ql, r, rl, own, ref_includes_query))
            if any(name in self.requires_clustering() for name in metrics):
                kwargs["cluster_labels"] = self.get_cluster_labels(**kwargs)
            return self._get_accuracy(self.curr_function_dict, **kwargs)
        finally:
            self._prepared = None

    def _get_accuracy(self, function_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {name: fn(**kwargs) for name, fn in function_dict.items()}

    def _check_names(self, name: str, value: Sequence[str]) -> None:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"Arguments must be of type tuple, not {type(value)} (`{name}`={value!r}).")
        known = [n[len(self.function_keyword) :] for n in dir(self) if n.startswith(self.function_keyword)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"Primary metrics must be one or more of: {known}. Got unknown `{name}` {unknown}.")

    def _inputs(
        self,
        query: Any,
        query_labels: Any,
        reference: Any,
        reference_labels: Any,
        ref_includes_query: bool,
        legacy: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, bool]:
        """Validated tensors on the device, and the reference position of every query (None: not included)."""
        q = _embeddings("query", query, self.device)
        ql = _labels("query_labels", query_labels, q.shape[0], "query", self.device)
        if reference is None:
            if reference_labels is not None:
                raise ValueError(
                    f"`reference_labels` must be None when `reference` is None, got {describe(reference_labels)}."
                )
            return q, ql, q, ql, torch.arange(q.shape[0], device=self.device), True
        if reference_labels is None:
            raise ValueError("`reference_labels` must be given with `reference`, got None.")
        r = _embeddings("reference", reference, self.device)
        if r.shape[1] != q.shape[1]:
            raise ValueError(f"`reference` must have {q.shape[1]} columns like `query`, got {describe(r)}.")
        rl = _labels("reference_labels", reference_labels, r.shape[0], "reference", self.device)
        if ql.shape[1:] != rl.shape[1:]:
            raise ValueError(f"`reference_labels` must have the label shape of `query_labels`, got {describe(rl)}.")
        if not ref_includes_query:
            return q, ql, r, rl, None, False
        if _is_prefix(q, ql, r, rl):
            return q, ql, r, rl, torch.arange(q.shape[0], device=self.device), True
        if legacy:
            return q, ql, r, rl, _locate_rows(q, ql, r, rl), True
        raise ValueError(
            "When ref_includes_query is True, the first len(query) elements of reference must be equal to query. "
            "Likewise, the first len(query_labels) elements of reference_labels must be equal to query_labels."
        )

    def _knn_kwargs(
        self,
        query: Tensor,
        query_labels: Tensor,
        reference: Tensor,
        reference_labels: Tensor,
        own: Tensor | None,
        ref_includes_query: bool,
    ) -> dict[str, Any]:
        """Neighbours, hits and lone-query information (the kNN keyword arguments of the metrics)."""
        fn = _custom(self.label_comparison_fn)
        label_counts = get_label_match_counts(query_labels, reference_labels, self.label_comparison_fn)
        n_relevant = count_relevant(query_labels, reference_labels, self_index=own, label_comparison_fn=fn)
        not_lone = n_relevant > 0
        num_k = self.determine_k(label_counts[1], reference.shape[0], ref_includes_query)
        if isinstance(self.knn_func, ExactKNN):
            if self.k == "max_bin_count":  # R can exceed the bin count - 1 under a non-reflexive comparison
                num_k = max(num_k, int(n_relevant.max()))
            distances, indices = self.knn_func.search(query, num_k, reference, own)
        else:
            distances, indices = self.knn_func(query, num_k, reference, ref_includes_query)
        knn_labels = reference_labels[indices]
        self._prepared = _Prepared(
            knn_labels=knn_labels,
            query_labels=query_labels,
            is_relevant=relevance_matrix(query_labels, reference_labels, indices, label_comparison_fn=fn),
            n_relevant=n_relevant,
        )
        if not bool(not_lone.any()):
            warnings.warn("None of the query labels are in the reference set.", UserWarning, stacklevel=3)
        return {
            "label_counts": label_counts,
            "knn_labels": knn_labels,
            "knn_distances": distances,
            "lone_query_labels": torch.unique(query_labels[~not_lone], dim=0),
            "not_lone_query_mask": not_lone,
        }


def _numpy(x: Any) -> Any:
    return x.cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
