"""``EmbeddingMetrics``: every retrieval metric of an embedding model, accumulated batch by batch, exact under DDP."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_str, describe
from torchmetrics_retrieval.functional._evaluate import evaluate
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional.ranking import PrecisionMode
from torchmetrics_retrieval.functional.reduction import EmptyTargetAction
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.search import Distance, KNNBackend, SearchPrecision
from torchmetrics_retrieval.metrics._batch import SET_FIELDS
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._per_query import PerQueryResults
from torchmetrics_retrieval.metrics._state import FieldSpec, SampleAccumulator, check_distributed

__all__ = ["EmbeddingMetrics"]


def _check_storage_dtype(value: Any) -> torch.dtype | None:
    if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
        raise TypeError(f"`storage_dtype` must be a floating torch.dtype or None, got {describe(value)}.")
    return value


class EmbeddingMetrics(SampleAccumulator, PerQueryResults):
    r"""Retrieval metrics of embeddings (CMC, precision, recall, mAP, NDCG, MAP@R, MRR, FNMR@FMR, PCF, NMI/AMI).

    ``update`` stores the embeddings, labels and optional per-sample fields of a batch; ``compute``
    gathers them across processes, drops the duplicates that ``DistributedSampler`` adds (when ``indexes``
    are given) and calls :func:`~torchmetrics_retrieval.functional.retrieval_metrics` once: one exact
    kNN pass serves every requested metric. The definitions are those of docs/definitions.md (ties
    ordered by position in the accumulated set, lone queries by ``empty_target_action``).

    Order of the accumulated set, which decides the tie order:

    * with ``indexes``: one sample per distinct index, ordered by index. The result is then the same
      for any number of processes and any batch split;
    * without: the samples in the order of the gather, i.e. rank 0's samples in update order, then
      rank 1's, ... (a single process: update order). Distance ties and DistributedSampler's padded
      duplicates may then make results depend on the number of processes.

    Args:
        cmc_top_k: cutoffs k of cmc@k.
        precision_top_k: cutoffs k of precision@k.
        map_top_k: cutoffs k of map@k.
        recall_top_k: cutoffs k of recall@k.
        ndcg_top_k: cutoffs k of ndcg@k.
        map_at_r: MAP@R.
        r_precision: R-precision.
        mrr: mean reciprocal rank over the full ranking.
        map_full: full-ranking mean average precision (key `map`).
        minp: mean inverse negative penalty: n(q) / rank of the last relevant item.
        clustering: NMI and AMI of a k-means clustering.
        fmr_vals: FMR values in [0, 1] of fnmr@fmr and tar@far.
        eer: equal error rate over every pair.
        roc_auc: area under the ROC curve over every pair (exact).
        min_dcf_p_target: target priors p in (0, 1) of min_dcf/{p} over every pair.
        dcf_costs: costs (C_miss, C_fa) of the detection cost of min_dcf.
        fpir_vals: FPIR values in [0, 1] of open-set dir@fpir and fnir@fpir.
        pcf_variance: explained-variance fractions in [0, 1] of pcf.
        distance: distance between embeddings.
        normalize: L2-normalise the embeddings first.
        precision_mode: precision@k divides by min(k, n(q)) or by k.
        empty_target_action: what a query without a relevant item counts as.
        avg_of_avgs: average per query label first, then over labels.
        per_class: also report every ranking key per query label.
        label_comparison_fn: custom relevance fn(query_labels[:, None], gallery_labels[None]) (must be
            picklable to pickle or clone the metric across processes).
        confidence_level: percentile-bootstrap interval of every ranking key ({key}/ci_low, /ci_high).
        n_bootstrap: bootstrap resamples of the intervals.
        seed: seed of the bootstrap resamples.
        knn_backend: kNN backend.
        search_precision: products of the kNN search's candidate pass (values never depend on it).
        chunk_size: rows per distance block (None: from a memory budget).
        progress: progress bars (tqdm, on stderr) on the passes that take more than a second.
        approximate_index: faiss index_factory string of an approximate index (None: exact search): every
            query is then searched on that index (keys ``approx/{key}``) and ``audit_queries`` of them, drawn
            with ``seed``, exactly (keys ``audit/...``; docs/definitions.md).
        approximate_params: faiss search parameters of that index, e.g. nprobe=32 (faiss's ``ParameterSpace``
            syntax, comma-separated).
        audit_queries: queries of the exact audit of an approximate index (all of them when there are fewer).
        prefix: string put before every key of the result (e.g. ``"val/"``).
        storage_dtype: dtype the embeddings are stored in (e.g. ``torch.float16`` halves the memory);
            ``compute`` reads half-precision rows as held (no float32 copy of the set) and gives the values of
            the same rows in float32. None: the dtype of the first batch.
        distributed: under DDP, ``"shard"`` (default): each process keeps its own samples; only the small
            fields (labels, ids, dataset indexes) are gathered, and the searches move blocks of rows between
            processes, so each process holds its own embeddings plus one visiting block. A set searched against
            itself has each pair of samples computed once, on one process: every process does 1/P of the search.
            ``"gather"``: every process gathers every sample and computes everything (torchmetrics' usual way).
            Both give identical values. Sharding covers the ranking metrics (with categories, per-class keys
            and intervals), the full-ranking ones (``mrr``, ``map_full``, ``minp``) and the pair metrics
            ``fmr_vals``, ``eer``, ``min_dcf_p_target`` and ``roc_auc``; with ``pcf_variance`` or
            ``clustering`` the samples are gathered.
            One process: no difference.
        kwargs: torchmetrics' own options (``compute_on_cpu``, ``sync_on_compute``, ``process_group``,
            ``dist_sync_fn``, ...); it refuses any other keyword.

    The options (``cmc_top_k`` to ``progress``) are the fields of
    :class:`~torchmetrics_retrieval.functional.RetrievalOptions`, which checks them.

    States are not saved in ``state_dict`` by default (they hold every embedding); call
    ``metric.persistent(True)`` to save them.

    Example:
        >>> metric = EmbeddingMetrics(cmc_top_k=(1,), precision_top_k=(2,), map_top_k=(), mrr=True, prefix="val/")
        >>> metric.update(torch.tensor([[0.0], [0.3], [5.0]]), torch.tensor([0, 0, 1]))
        >>> metric.update(torch.tensor([[5.1], [0.2]]), torch.tensor([1, 1]))
        >>> {key: round(float(value), 4) for key, value in metric.compute().items()}
        {'val/cmc/1': 0.4, 'val/precision/2': 0.6, 'val/mrr': 0.6667}
        >>> metric.worst_queries("cmc/1", 2).tolist()  # positions in the accumulated set
        [0, 1]
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    _fields = (
        *SET_FIELDS,
        FieldSpec("categories", "ids", optional=True),
        FieldSpec("camera_ids", "ids", optional=True),
        FieldSpec("indexes", "indexes", optional=True),
    )

    embeddings: list[Tensor]
    labels: list[Tensor]

    def __init__(
        self,
        *,
        cmc_top_k: int | Iterable[int] = (1, 5),
        precision_top_k: int | Iterable[int] = (5,),
        map_top_k: int | Iterable[int] = (5,),
        recall_top_k: int | Iterable[int] = (),
        ndcg_top_k: int | Iterable[int] = (),
        map_at_r: bool = False,
        r_precision: bool = False,
        mrr: bool = False,
        map_full: bool = False,
        minp: bool = False,
        clustering: bool = False,
        fmr_vals: float | Iterable[float] = (),
        eer: bool = False,
        roc_auc: bool = False,
        min_dcf_p_target: float | Iterable[float] = (),
        dcf_costs: tuple[float, float] = (1.0, 1.0),
        fpir_vals: float | Iterable[float] = (),
        pcf_variance: float | Iterable[float] = (),
        distance: Distance = "euclidean",
        normalize: bool = False,
        precision_mode: PrecisionMode = "min_k_n",
        empty_target_action: EmptyTargetAction = "skip",
        avg_of_avgs: bool = False,
        per_class: bool = False,
        label_comparison_fn: LabelComparisonFn | None = None,
        confidence_level: float | None = None,
        n_bootstrap: int = 1000,
        seed: int = 0,
        knn_backend: KNNBackend = "auto",
        search_precision: SearchPrecision = "auto",
        chunk_size: int | None = None,
        progress: bool = False,
        approximate_index: str | None = None,
        approximate_params: str = "",
        audit_queries: int = 2000,
        prefix: str = "",
        storage_dtype: torch.dtype | None = None,
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        options = RetrievalOptions.from_arguments(locals())  # first: locals() holds the parameters only
        check_str("prefix", prefix)
        check_distributed(distributed)
        storage = _check_storage_dtype(storage_dtype)
        super().__init__(**kwargs)  # torchmetrics' own options; it refuses any other keyword
        self.options = options
        self.storage_dtype = storage
        self.prefix = prefix
        self.distributed = distributed
        self._per_query: RetrievalResult | None = None
        self._sample_indexes: Tensor | None = None

    def update(
        self,
        embeddings: Tensor,
        labels: Tensor,
        is_query: Tensor | None = None,
        is_gallery: Tensor | None = None,
        sequence_ids: Tensor | None = None,
        search_groups: Tensor | None = None,
        categories: Tensor | None = None,
        indexes: Tensor | None = None,
        camera_ids: Tensor | None = None,
    ) -> None:
        """Store a batch (nothing is stored if a check fails; a batch of zero rows is a no-op).

        Args:
            embeddings: ``(B, D)`` floating, finite; D the same in every batch.
            labels: ``(B,)`` or ``(B, L)``, any real dtype; shape and dtype the same in every batch.
            is_query: ``(B,)`` bool, which samples are queries; a missing mask means all True (every sample is
                then both a query and a gallery item, and never retrieves itself).
            is_gallery: ``(B,)`` bool, which samples are gallery items (missing: all True).
            sequence_ids: ``(B,)`` integer; a query never retrieves items of its own sequence.
            search_groups: ``(B,)`` integer; a query only retrieves items of its own group.
            categories: ``(B,)`` integer; every metric is also reported per query category.
            camera_ids: ``(B,)`` integer camera of each sample (re-identification): an item with the query's
                label and camera is left out of its gallery.
            indexes: ``(B,)`` integer dataset index of each sample, to drop DDP duplicates and fix the order.

        An optional field given in one batch must be given in every batch (and vice versa).

        Raises:
            TypeError, ValueError: naming the argument and what was expected.
        """
        self._per_query = None
        self._store(
            embeddings=embeddings,
            labels=labels,
            is_query=is_query,
            is_gallery=is_gallery,
            sequence_ids=sequence_ids,
            search_groups=search_groups,
            categories=categories,
            camera_ids=camera_ids,
            indexes=indexes,
        )

    def _prepare(self, batch: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
        """Cast the embeddings to ``storage_dtype`` (or to the dtype of the first stored batch)."""
        embeddings = batch["embeddings"]
        dtype = self.storage_dtype or (self.embeddings[0].dtype if len(self.embeddings) else None)
        if embeddings is not None and dtype is not None:
            batch["embeddings"] = embeddings.to(dtype)
        return batch

    # ---- sharded mode -------------------------------------------------------------------------------------------

    def _sharded_values(self) -> bool:
        from torchmetrics_retrieval.metrics._sharded.embedding import shardable

        return shardable(self.options)

    def compute(self) -> dict[str, Tensor]:
        """The metrics of every sample of every process (sharded or gathered, identical values)."""
        if not self._sharding():
            return cast(dict[str, Tensor], super().compute())
        from torchmetrics_retrieval.metrics._sharded.embedding import sharded_compute
        from torchmetrics_retrieval.metrics._sharded.faults import agreed

        with agreed(self.process_group, f"{type(self).__name__}.compute()"):  # a rank's failure raised on every rank
            metrics, per_query, sample_indexes = sharded_compute(self, self.process_group)
        self._per_query, self._sample_indexes = per_query, sample_indexes
        return {f"{self.prefix}{key}": value for key, value in metrics.items()}

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> dict[str, Tensor]:
        embeddings = cast(Tensor, fields.pop("embeddings"))  # never None: _collect raises first; half rows as held
        labels = cast(Tensor, fields.pop("labels"))
        metrics, result = evaluate(embeddings, labels, None, None, self.options, **cast(dict[str, Any], fields))
        self._per_query = result
        self._sample_indexes = indexes
        return {f"{self.prefix}{key}": value for key, value in metrics.items()}

    def reset(self) -> None:
        """Forget every stored sample and the per-query results."""
        super().reset()
        self._per_query = None
        self._sample_indexes = None

    def plot(self, val: dict[str, Tensor] | list[dict[str, Tensor]] | None = None, ax: Any = None) -> Any:
        """Plot the metric values (torchmetrics' convention): one point per key, or one line per key over steps;
        a result with confidence intervals (``confidence_level``) as a forest plot (:func:`plotting.plot_forest`).

        Args:
            val: a result of ``compute()`` or a list of them (one per step); None: call ``compute()``.
            ax: a matplotlib axis to draw on (None: a new figure).

        Returns:
            ``(figure, axis)``.

        Example:
            >>> import matplotlib; matplotlib.use("Agg")
            >>> metric = EmbeddingMetrics(cmc_top_k=(1,), map_top_k=(), precision_top_k=(1,))
            >>> metric.update(torch.tensor([[0.0], [0.1], [5.0], [5.1]]), torch.tensor([0, 0, 1, 1]))
            >>> fig, ax = metric.plot()
        """
        from torchmetrics_retrieval.plotting import plot_forest, require_matplotlib

        require_matplotlib()
        if isinstance(val, dict) and any(key.endswith("/ci_low") for key in val):  # values with intervals
            return plot_forest({"": val}, ax=ax)
        return self._plot(val, ax)
