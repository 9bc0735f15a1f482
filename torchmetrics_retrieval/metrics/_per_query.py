"""What :class:`~torchmetrics_retrieval.EmbeddingMetrics` keeps of its last ``compute()`` per query: the worst
queries, the per-query values to compare two models, and the plots of both."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_positive_int
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute

__all__ = ["PerQueryResults"]


class PerQueryResults:
    """The per-query results of the last ``compute()`` of a metric that sets ``_per_query`` and
    ``_sample_indexes`` there (and clears them in ``update``/``reset``); keys may carry the metric's ``prefix``."""

    options: RetrievalOptions
    prefix: str
    _per_query: RetrievalResult | None
    _sample_indexes: Tensor | None

    if TYPE_CHECKING:

        def compute(self) -> dict[str, Tensor]: ...

    @property
    def per_query(self) -> RetrievalResult | None:
        """Per-query values, retrieved positions and distances of the last ``compute()``.

        Positions (``indices``, ``query_positions``) refer to the accumulated set after the gather and the
        de-duplication; :attr:`sample_indexes` maps them to dataset indexes. None before ``compute()``
        (and after ``update``/``reset``) or when no ranking metric was requested.
        """
        return self._per_query

    @property
    def sample_indexes(self) -> Tensor | None:
        """``(N,)`` dataset index of every position of the accumulated set (None when ``indexes`` were not given)."""
        return self._sample_indexes

    def worst_queries(self, metric: str, n: int = 10) -> Tensor:
        """Positions (in the accumulated set) of the ``n`` counted queries with the lowest ``metric``, ties by position.

        Args:
            metric: a per-query key such as ``"cmc/1"`` or ``"map/5"``, with or without ``prefix``.
            n: number of queries (fewer if fewer queries count).

        Raises:
            RuntimeError: before ``compute()`` or when no ranking metric was requested.
            ValueError: for an unknown key or ``n < 1``.
        """
        result = self._require_per_query()
        check_positive_int("n", n)
        metric = self._unprefixed(result, metric)
        return result.worst_queries(metric, n)

    def per_query_values(self, metric: str) -> tuple[Tensor, Tensor]:
        """``(ids, values)`` of the counted queries for ``metric``, to compare two models query by query.

        ``ids`` are the queries' dataset indexes when ``indexes`` were given, else their positions in the
        accumulated set; ``values`` are after ``empty_target_action``. Give two models' pairs to
        :func:`~torchmetrics_retrieval.functional.compare_models`, which aligns them by ``ids``.

        Example:
            >>> import torch
            >>> from torchmetrics_retrieval import EmbeddingMetrics
            >>> metric = EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(), map_top_k=())
            >>> metric.update(torch.tensor([[0.0], [0.1], [5.0], [9.0]]), torch.tensor([0, 0, 1, 0]),
            ...               indexes=torch.tensor([7, 3, 5, 1]))
            >>> ids, values = metric.per_query_values("cmc/1")  # index 5 is alone with its label: not counted
            >>> ids.tolist(), values.tolist()
            ([1, 3, 7], [0.0, 1.0, 1.0])
        """
        result = self._computed_per_query()
        metric = self._unprefixed(result, metric)
        if metric not in result.values:
            raise ValueError(f"`metric` must be one of the per-query keys {sorted(result.values)}, got {metric!r}.")
        values, counted = _apply_empty_target_action_compute(
            result.values[metric][:, None], result.n_relevant, self.options.empty_target_action
        )
        positions = result.query_positions[counted]
        ids = positions if self._sample_indexes is None else self._sample_indexes[positions]
        return ids, values[counted, 0]

    def _unprefixed(self, result: RetrievalResult, metric: str) -> str:
        """``metric`` without the metric's ``prefix``, unless the prefixed name is itself a per-query key."""
        if metric not in result.values and self.prefix and metric.startswith(self.prefix):
            return metric[len(self.prefix) :]
        return metric

    def _computed_per_query(self) -> RetrievalResult:
        """The per-query results, calling ``compute()`` first when it has not run since the last update."""
        if self._per_query is None:
            self.compute()
        return self._require_per_query()

    def _require_per_query(self) -> RetrievalResult:
        if self._per_query is None:
            raise RuntimeError(
                "No per-query results: call compute() first (after the last update), with at least one ranking "
                "metric requested."
            )
        return self._per_query

    def plot_curve(self, curve: Literal["cmc", "precision"] = "cmc", ax: Any = None) -> Any:
        """Plot the CMC curve (``curve="cmc"``) or the precision@k curve (``"precision"``) of the last compute.

        The curve runs over k = 1 .. K, K the largest cutoff retrieved (see :func:`plotting.plot_cmc_curve`).
        """
        from torchmetrics_retrieval.plotting import plot_cmc_curve

        return plot_cmc_curve(
            self._computed_per_query(), curve=curve, precision_mode=self.options.precision_mode, ax=ax
        )

    def plot_worst_queries(
        self, metric: str, n: int = 5, *, n_neighbours: int = 5, draw_item: Callable[[Any, int], None] | None = None
    ) -> Any:
        """A grid of the ``n`` worst queries for ``metric`` and their nearest retrieved items.

        ``draw_item(ax, item)`` draws one item, where ``item`` is its dataset index when ``indexes`` were
        given, else its position in the accumulated set. See :func:`plotting.plot_worst_queries`.
        """
        from torchmetrics_retrieval.plotting import plot_worst_queries

        result = self._computed_per_query()
        metric = self._unprefixed(result, metric)
        return plot_worst_queries(
            result, metric, n, n_neighbours=n_neighbours, draw_item=draw_item, item_ids=self._sample_indexes
        )
