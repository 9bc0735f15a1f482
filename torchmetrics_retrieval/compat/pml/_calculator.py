"""``AccuracyCalculator``: pytorch-metric-learning's class (constructor, methods, numbers) on the functional core."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.compat.pml._functions import get_label_match_counts, nan_accuracy
from torchmetrics_retrieval.compat.pml._inputs import as_device, as_numpy, check_inputs, row_codes, v1_order
from torchmetrics_retrieval.compat.pml._search import ExactKNN, KMeans, KMeansFunc, KNNFunc
from torchmetrics_retrieval.compat.pml._values import (
    EQUALITY,
    KNN_METRICS,
    Accuracy,
    LabelComparison,
    custom_fn,
    knn_hits,
    per_query_values,
    reduce_values,
)
from torchmetrics_retrieval.functional._options import BOOL, check_option
from torchmetrics_retrieval.functional.relevance import count_relevant, relevance_matrix

__all__ = ["AccuracyCalculator"]


class _Prepared(NamedTuple):
    """Hits of the current search, reused by the built-in metrics when they get the same tensors."""

    knn_labels: Tensor
    query_labels: Tensor
    is_relevant: Tensor
    n_relevant: Tensor


class AccuracyCalculator:
    """pytorch-metric-learning's ``AccuracyCalculator`` (same constructor, methods and numbers).

    Metrics (every ``calculate_<name>`` method; all of them by default, in alphabetical order):
    ``AMI``, ``NMI`` (k-means of the queries with one cluster per distinct query label, against the query
    labels, scikit-learn's scores), ``mean_average_precision``, ``mean_average_precision_at_r``,
    ``mean_reciprocal_rank``, ``precision_at_1``, ``r_precision``. See :mod:`torchmetrics_retrieval.compat.pml`
    for the exact definitions and the points where docs/definitions.md is followed instead of
    pytorch-metric-learning.

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

        check_option("avg_of_avgs", avg_of_avgs)
        BOOL.check("return_per_class", return_per_class)
        if avg_of_avgs and return_per_class:
            raise ValueError("avg_of_avgs and return_per_class are mutually exclusive")
        self.avg_of_avgs = avg_of_avgs
        self.return_per_class = return_per_class

        self.device = as_device(device)
        self.knn_func: KNNFunc = ExactKNN() if knn_func is None else knn_func
        self.kmeans_func: KMeansFunc = KMeans() if kmeans_func is None else kmeans_func

        valid_int = isinstance(k, int) and not isinstance(k, bool) and k > 0
        if not (valid_int or k is None or k == "max_bin_count"):
            raise ValueError(f"k must be an integer greater than 0, or None, or 'max_bin_count'; got `k`={k!r}.")
        self.k = k

        check_option("label_comparison_fn", label_comparison_fn)
        if label_comparison_fn is not None and any(n in self.requires_clustering() for n in self.get_curr_metrics()):
            raise NotImplementedError("Unsupported: clustering + custom label comparison")
        self.label_comparison_fn: LabelComparison = EQUALITY if label_comparison_fn is None else label_comparison_fn
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
        return list(KNN_METRICS)

    def check_primary_metrics(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        """``include`` and ``exclude`` must be tuples or lists of metric names (``calculate_<name>`` methods).

        Called by the constructor and by ``get_accuracy`` (pytorch-metric-learning ignores typos there).
        """
        known = [n[len(self.function_keyword) :] for n in dir(self) if n.startswith(self.function_keyword)]
        for name, value in (("include", include), ("exclude", exclude)):
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"Arguments must be of type tuple, not {type(value)} (`{name}`={value!r}).")
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise ValueError(f"Primary metrics must be one or more of: {known}. Got unknown `{name}` {unknown}.")

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

        return float(normalized_mutual_info_score(row_codes(query_labels).cpu().numpy(), as_numpy(cluster_labels)))

    def calculate_AMI(self, query_labels: Tensor, cluster_labels: Tensor, **kwargs: Any) -> float:
        """Adjusted mutual information between query labels and clusters (scikit-learn)."""
        from sklearn.metrics import adjusted_mutual_info_score

        return float(adjusted_mutual_info_score(row_codes(query_labels).cpu().numpy(), as_numpy(cluster_labels)))

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
            fn = self.label_comparison_fn
            is_relevant, n_relevant = knn_hits(query_labels, knn_labels, label_counts, ref_includes_query, fn)
        keep = not_lone_query_mask
        values = per_query_values(metric, is_relevant[keep], n_relevant[keep])
        return reduce_values(values, query_labels[keep], self.avg_of_avgs, self.return_per_class)

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
        metric = "mean_average_precision_at_r"
        return self._knn_metric(metric, knn_labels, query_labels, not_lone_query_mask, label_counts, ref_includes_query)

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
        if v1_order(query, query_labels, reference, reference_labels):
            warnings.warn(
                "get_accuracy(query, reference, query_labels, reference_labels, ...) is the 1.x argument order; use "
                "get_accuracy(query, query_labels, reference, reference_labels, ref_includes_query).",
                DeprecationWarning,
                2,
            )
            query_labels, reference, legacy = reference, query_labels, True
        self.check_primary_metrics(include, exclude)
        q, ql, r, rl, own, ref_includes_query = check_inputs(
            query, query_labels, reference, reference_labels, ref_includes_query, legacy, self.device
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
        fn = custom_fn(self.label_comparison_fn)
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
