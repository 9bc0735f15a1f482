"""``QrelsMetrics``: :func:`~torchmetrics_retrieval.functional.qrels_metrics` as a metric that accumulates query and
corpus embeddings with their ids, the qrels given at construction."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Literal, cast

from torch import Tensor
from torchmetrics import Metric

from torchmetrics_retrieval.functional._checks import check_embeddings, check_str
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional._qrels_inputs import Qrels, check_id_list, parse_qrels
from torchmetrics_retrieval.functional.qrels import (
    QrelsDistance,
    Ties,
    check_search_arguments,
    checked_cutoffs,
    qrels_per_query,
    reduce_qrels,
)
from torchmetrics_retrieval.metrics._kwargs import MetricKwargs, Unpack
from torchmetrics_retrieval.metrics._state import FieldSpec, SampleAccumulator, check_distributed, validate_batch

__all__ = ["QrelsMetrics"]


class _Side(SampleAccumulator):
    """The queries or the corpus: embeddings and integer ids; the ids are the ``indexes`` of the accumulator, so the
    rows are de-duplicated by id and ordered by id after the gather (the values never depend on the number of
    processes nor on the update order)."""

    def __init__(self, side: str, **kwargs: Any) -> None:
        self.side = side
        self._fields = (FieldSpec(side, "embeddings"), FieldSpec(f"{side}_ids", "indexes"))
        super().__init__(**kwargs)

    def update(self, batch: dict[str, Tensor | None]) -> None:
        self._store(**batch)

    def _compute_samples(self, fields: dict[str, Tensor | None], indexes: Tensor | None) -> tuple[Tensor, Tensor]:
        return cast(Tensor, fields[self.side]), cast(Tensor, indexes)


class QrelsMetrics(Metric):
    """trec_eval's measures of accumulated query and corpus embeddings, judged by qrels given at construction.

    ``update(query=..., query_ids=...)`` and ``update(corpus=..., corpus_ids=...)`` (in any batches, either side or
    both at once); ids are integer tensors, matched to the qrels' ids as strings (``7`` is ``"7"``). A row seen twice
    (DistributedSampler's padding) counts once. ``compute`` returns the keys of :func:`qrels_metrics`
    (definitions: docs/definitions.md, "Graded relevance with qrels").

    Under DDP (``distributed="shard"``, the default) each process keeps its own corpus rows: only the corpus ids and
    the queries are gathered, every process searches its shard and the exact global top k is merged
    (``metrics/_sharded/qrels.py``). ``distributed="gather"`` gathers both sides to every process. Both order the
    rows by id, so every world size gives the values of one process, bit for bit.

    Args:
        qrels: ``{query id: {document id: grade}}`` or ``(query ids, document ids, grades)``.
        ndcg_top_k: cutoffs k of ``ndcg/{k}``.
        map_top_k: cutoffs k of ``map/{k}``.
        recall_top_k: cutoffs k of ``recall/{k}``.
        precision_top_k: cutoffs k of ``precision/{k}``.
        mrr: ``mrr`` over the whole ranking.
        r_precision: ``r_precision``.
        distance: ``"cosine"``, ``"dot"`` or ``"euclidean"``.
        relevance_level: the smallest relevant grade.
        ignore_identical_ids: leave the document with the query's id out of its ranking.
        ties: ``"position"`` (here: ascending corpus id), ``"trec_eval"`` or ``"expected"``.
        confidence_level: percentile-bootstrap intervals (``{key}/ci_low``, ``{key}/ci_high``).
        n_bootstrap: bootstrap resamples.
        seed: seed of the resamples.
        knn_backend: kNN backend.
        chunk_size: rows per distance block.
        prefix: string put before every key.
        distributed: under DDP, ``"shard"`` (the corpus stays on its process) or ``"gather"``.
        kwargs: torchmetrics' options (``process_group``, ``dist_sync_fn``, ...).

    Example:
        >>> import torch
        >>> metric = QrelsMetrics({"1": {"11": 2, "12": 1}, "2": {"10": 1}}, ndcg_top_k=2, mrr=True)
        >>> corpus = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])
        >>> metric.update(corpus=corpus, corpus_ids=torch.tensor([10, 11, 12]))
        >>> metric.update(query=torch.tensor([[1.0, 0.0], [0.0, 1.0]]), query_ids=torch.tensor([1, 2]))
        >>> {key: round(float(value), 4) for key, value in metric.compute().items()}
        {'ndcg/2': 0.1199, 'mrr': 0.4167, 'tie_rate': 0.0}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(
        self,
        qrels: Qrels,
        *,
        ndcg_top_k: int | Iterable[int] = (10,),
        map_top_k: int | Iterable[int] = (),
        recall_top_k: int | Iterable[int] = (),
        precision_top_k: int | Iterable[int] = (),
        mrr: bool = False,
        r_precision: bool = False,
        distance: QrelsDistance = "cosine",
        relevance_level: int = 1,
        ignore_identical_ids: bool = False,
        ties: Ties = "position",
        confidence_level: float | None = None,
        n_bootstrap: int = 1000,
        seed: int = 0,
        knn_backend: Literal["auto", "torch", "faiss"] = "auto",
        chunk_size: int | None = None,
        prefix: str = "",
        distributed: Literal["shard", "gather"] = "shard",
        **kwargs: Unpack[MetricKwargs],
    ) -> None:
        self._triples = parse_qrels(qrels)  # checked now, not at the first compute
        self._cutoffs = checked_cutoffs(ndcg_top_k, map_top_k, recall_top_k, precision_top_k, mrr, r_precision)
        # the keyword arguments of qrels_per_query, checked now rather than at the first compute
        self._search = check_search_arguments(
            distance, relevance_level, ignore_identical_ids, ties, knn_backend, chunk_size
        )
        check_str("prefix", prefix)
        check_distributed(distributed)
        self.distributed = distributed
        self._options = RetrievalOptions.create(confidence_level=confidence_level, n_bootstrap=n_bootstrap, seed=seed)
        super().__init__(**kwargs)
        self.prefix = prefix
        self.queries, self.corpus = _Side("query", **kwargs), _Side("corpus", **kwargs)

    def update(
        self,
        query: Tensor | None = None,
        query_ids: Tensor | None = None,
        corpus: Tensor | None = None,
        corpus_ids: Tensor | None = None,
    ) -> None:
        """Store queries and/or corpus documents with their integer ids; nothing is stored when a check fails."""
        given = []
        sides = (("query", query, query_ids, self.queries), ("corpus", corpus, corpus_ids, self.corpus))
        for name, embeddings, ids, side in sides:
            if (embeddings is None) != (ids is None):
                raise ValueError(f"`{name}` and `{name}_ids` must be given together, got only one of them.")
            if embeddings is not None:
                batch = {name: embeddings, f"{name}_ids": ids}
                validate_batch(side._fields, batch, side._previous_batch())  # both sides checked before storing
                given.append((side, batch))
        if not given:
            raise ValueError("`update` needs `query`/`query_ids` or `corpus`/`corpus_ids`, got neither.")
        for side, batch in given:
            side.update(batch)

    def compute(self) -> dict[str, Tensor]:
        """The measures over every accumulated (and gathered) query and document."""
        from torchmetrics_retrieval.metrics._state import runs_sharded

        try:
            if runs_sharded(self, self.distributed, True):
                result = self._sharded()
            else:
                query, query_ids = self._side(self.queries, "query")
                corpus, corpus_ids = self._side(self.corpus, "corpus")
                result = qrels_per_query(
                    query, query_ids, corpus.to(query.dtype), corpus_ids, self._triples_as_qrels(), self._cutoffs,
                    **self._search,
                )  # fmt: skip
        except Exception:
            if self._is_synced and self._cache is not None:  # as CrossModalRetrieval: undo the outer sync
                self.unsync()
            raise
        return {f"{self.prefix}{key}": value for key, value in reduce_qrels(result, self._options).items()}

    def _sharded(self) -> RetrievalResult:
        """The per-query result with the corpus left on its process (``metrics/_sharded/qrels.py``)."""
        from torchmetrics_retrieval.metrics._sharded.faults import agreed
        from torchmetrics_retrieval.metrics._sharded.qrels import sharded_qrels

        with agreed(self.process_group, f"{type(self).__name__}.compute()"):  # raised on every rank
            query, query_ids = self._side(self.queries, "query")  # the queries are few: gathered
            query = check_embeddings("query", query)
            qids = check_id_list("query_ids", query_ids, query.shape[0], "query")
            try:
                return sharded_qrels(self, query, qids, self._triples, self._cutoffs, self.process_group)
            except ValueError as error:
                if "needs at least one sample" in str(error):
                    raise ValueError(
                        "QrelsMetrics.compute() needs `corpus` rows, got none: call update(corpus=..., corpus_ids=...)."
                    ) from None
                raise

    def _triples_as_qrels(self) -> tuple[list[str], list[str], list[int]]:
        qids, dids, grades = zip(*self._triples, strict=True) if self._triples else ((), (), ())
        return list(qids), list(dids), list(grades)

    @staticmethod
    def _side(side: _Side, name: str) -> tuple[Tensor, Tensor]:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
            try:
                samples = cast(tuple[Tensor, Tensor], side.compute())
            except ValueError:
                raise ValueError(
                    f"QrelsMetrics.compute() needs `{name}` rows, got none: call update({name}=..., {name}_ids=...)."
                ) from None
        side._computed = None  # torchmetrics keeps a computed value: here, a copy of the embeddings
        return samples

    @property
    def metric_state(self) -> dict[str, Any]:
        """The states of both sides (``query``, ``query_ids``, ``corpus``, ``corpus_ids``)."""
        return {**self.queries.metric_state, **self.corpus.metric_state}

    def reset(self) -> None:
        """Forget every stored row."""
        super().reset()
        self.queries.reset()
        self.corpus.reset()
