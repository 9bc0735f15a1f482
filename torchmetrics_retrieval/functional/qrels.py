"""Graded relevance with qrels: query and corpus embeddings with their ids, sparse judgements in, trec_eval's
measures out (``ndcg_cut``, ``map_cut``, ``recall``, ``P``, ``recip_rank``, ``Rprec``), exact, at corpus scale.

The stages, each in its own module: ``_qrels_inputs`` (ids as strings, the judgements as sorted int64 keys) ->
``_qrels_search`` (one exact kNN search deep enough for every cutoff; the full-ranking count for a first relevant
document beyond it) -> ``_qrels_values`` (every cutoff of every measure in one pass of cumulative sums, with the
tie rules) -> the mean over the judged queries and the bootstrap intervals of ``retrieval_metrics``.

Definitions (and how they meet trec_eval's): docs/definitions.md, "Graded relevance with qrels".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypedDict, overload

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_bool, check_choice, check_embeddings, check_top_k, describe
from torchmetrics_retrieval.functional._options import RetrievalOptions, Unpack, check_option
from torchmetrics_retrieval.functional._per_query import RetrievalResult
from torchmetrics_retrieval.functional._qrels_inputs import (
    Ids,
    Qrels,
    QrelsTable,
    check_id_list,
    make_table,
    parse_qrels,
)
from torchmetrics_retrieval.functional._qrels_search import BlockedCorpus, ranked_chunks
from torchmetrics_retrieval.functional._qrels_values import Cutoffs, list_values
from torchmetrics_retrieval.functional._reduce import _intervals
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional.reduction import _masked_mean_compute

__all__ = ["QRELS_DISTANCES", "TIES", "QrelsDistance", "Ties", "qrels_metrics"]

QrelsDistance = Literal["cosine", "dot", "euclidean"]
Ties = Literal["position", "trec_eval", "expected"]
QRELS_DISTANCES: tuple[str, ...] = ("cosine", "dot", "euclidean")
TIES: tuple[str, ...] = ("position", "trec_eval", "expected")


def trec_eval_order(corpus_ids: list[str]) -> list[int] | None:
    """The corpus positions in trec_eval's tie order (document id descending, compared as strings), or None when
    the corpus is already in it: the search then breaks ties by position exactly as trec_eval does."""
    order = sorted(range(len(corpus_ids)), key=corpus_ids.__getitem__, reverse=True)
    return None if order == list(range(len(corpus_ids))) else order


def identical_positions(qids: list[str], cids: list[str], device: torch.device) -> Tensor | None:
    """Per query, the corpus position of the document with its own id (-1: none), or None when no query has one
    (BEIR's ``ignore_identical_ids``: that document is left out of the query's ranking)."""
    at = {c: j for j, c in enumerate(cids)}
    positions = torch.tensor([at.get(q, -1) for q in qids], dtype=torch.long, device=device)
    return positions if bool((positions >= 0).any()) else None


def qrels_per_query(
    query: Tensor,
    query_ids: Ids,
    corpus: Tensor,
    corpus_ids: Ids,
    qrels: Qrels,
    cutoffs: Cutoffs,
    *,
    distance: str = "cosine",
    relevance_level: int = 1,
    ignore_identical_ids: bool = False,
    ties: str = "position",
    knn_backend: str = "auto",
    chunk_size: int | None = None,
) -> RetrievalResult:
    """The per-query values of :func:`qrels_metrics` (its arguments checked here, the cutoffs already), as a
    :class:`RetrievalResult` whose ``counted`` are the judged queries; no neighbour table is kept."""
    query = check_embeddings("query", query)
    corpus = check_embeddings("corpus", corpus)
    if corpus.shape[1] != query.shape[1] or corpus.device != query.device:
        raise ValueError(
            f"`corpus` must have the columns ({query.shape[1]}) and device of `query`, got {describe(corpus)}."
        )
    check_search_arguments(distance, relevance_level, ignore_identical_ids, ties, knn_backend, chunk_size)
    qids = check_id_list("query_ids", query_ids, query.shape[0], "query")
    cids = check_id_list("corpus_ids", corpus_ids, corpus.shape[0], "corpus")
    triples = parse_qrels(qrels)
    order = trec_eval_order(cids) if ties == "trec_eval" else None
    if order is not None:  # a reordered copy of the corpus: trec_eval's ties become the search's own
        corpus = corpus[torch.tensor(order, device=corpus.device)]
        cids = [cids[i] for i in order]
    device = query.device
    table = make_table(triples, qids, cids, relevance_level, device)
    self_index = identical_positions(qids, cids, device) if ignore_identical_ids else None
    n_corpus = corpus.shape[0]
    positions = torch.arange(n_corpus, device=device)
    blocked = BlockedCorpus(query, corpus, positions, self_index, n_corpus, distance, knn_backend, chunk_size)
    if len(blocked.blocks) > 1:  # one block's problem is the whole one, and checks the rows itself
        check_rows(query, corpus, distance)
    parts = qrels_values(blocked, table, cutoffs, relevance_level, ties == "expected")
    return qrels_result(parts, cutoffs, table, query.shape[0], device)


def check_rows(query: Tensor, corpus: Tensor, distance: str) -> None:
    """The engine's checks of the rows (e.g. no zero row for cosine), on the whole inputs before any block is
    searched: its errors then name the rows as the user gave them, not as rows of a block. No copy (float64 rows
    are read lazily)."""
    make_problem(query, corpus, distance, Exclusions(None, None, None), False, ("query", "corpus"), lazy64=True)


def qrels_values(
    corpus: BlockedCorpus, table: QrelsTable, cutoffs: Cutoffs, relevance_level: int, expected: bool
) -> list[dict[str, Tensor]]:
    """The per-query values, chunk of queries by chunk (every process of a sharded corpus walks the same chunks)."""
    n_rel_max = int(table.n_relevant.max()) if cutoffs.r_precision and corpus.query.shape[0] else 0
    depth = max((*cutoffs.every, n_rel_max, 1))
    parts: list[dict[str, Tensor]] = []
    for rows, found, complete in ranked_chunks(corpus, depth, expected):
        grades = table.grades_at(rows, found.indices)
        values, beyond = list_values(
            cutoffs, found.distances, found.valid, grades, complete, table.n_relevant[rows],
            table.ideal[rows], relevance_level, expected,
        )  # fmt: skip
        if bool(beyond.any()):  # the same rows on every process: each enters the counts
            far = torch.nonzero(beyond).flatten()
            values["mrr"][far] = corpus.first_relevant_rr(rows[far], table, relevance_level, expected)
        parts.append(values)
    return parts


def qrels_result(
    parts: list[dict[str, Tensor]], cutoffs: Cutoffs, table: QrelsTable, n_query: int, device: torch.device
) -> RetrievalResult:
    """The :class:`RetrievalResult` of the chunks' values; no neighbour table is kept."""
    empty = torch.zeros(n_query, 0, device=device)
    per_key = {
        key: torch.cat([part[key] for part in parts]) if parts else empty[:, 0].double() for key in cutoffs.keys()
    }
    positions = torch.arange(n_query, device=device)
    return RetrievalResult(
        values=per_key,
        counted=table.judged,
        n_relevant=table.n_relevant,
        indices=empty.long(),
        distances=empty,
        valid=empty.bool(),
        is_relevant=empty.bool(),
        query_positions=positions,
        query_labels=positions,
        query_categories=None,
    )


def checked_cutoffs(
    ndcg_top_k: int | Iterable[int],
    map_top_k: int | Iterable[int],
    recall_top_k: int | Iterable[int],
    precision_top_k: int | Iterable[int],
    mrr: bool,
    r_precision: bool,
) -> Cutoffs:
    """The measures that :func:`qrels_metrics` and ``QrelsMetrics`` are asked for, each option checked under its own
    name; at least one measure."""
    cutoffs = Cutoffs(
        check_top_k("ndcg_top_k", ndcg_top_k),
        check_top_k("map_top_k", map_top_k),
        check_top_k("recall_top_k", recall_top_k),
        check_top_k("precision_top_k", precision_top_k),
        check_bool("mrr", mrr),
        check_bool("r_precision", r_precision),
    )
    if not cutoffs.keys():
        raise ValueError(
            "`ndcg_top_k`, `map_top_k`, `recall_top_k`, `precision_top_k`, `mrr` and `r_precision` "
            "ask for no measure: give at least one."
        )
    return cutoffs


def check_search_arguments(
    distance: str, relevance_level: int, ignore_identical_ids: bool, ties: str, knn_backend: str, chunk_size: int | None
) -> dict[str, Any]:
    """Check the search and grading options of :func:`qrels_per_query` (each error names its option) and return them
    as its keyword arguments: ``QrelsMetrics`` checks them at construction with this and passes them on."""
    check_choice("distance", distance, QRELS_DISTANCES)
    check_choice("ties", ties, TIES)
    return {
        "distance": distance,
        "relevance_level": _check_level(relevance_level),
        "ignore_identical_ids": check_bool("ignore_identical_ids", ignore_identical_ids),
        "ties": ties,
        "knn_backend": check_option("knn_backend", knn_backend),
        "chunk_size": check_option("chunk_size", chunk_size),
    }


def _check_level(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`relevance_level` must be an int >= 1, got {describe(value)}.")
    if value < 1:
        raise ValueError(f"`relevance_level` must be an int >= 1, got {value}.")
    return value


class QrelsArguments(TypedDict, total=False):
    """The options of :func:`qrels_metrics` as keyword arguments: the type of ``**options`` in its overloads, so that
    mypy refuses a misspelt option there too."""

    ndcg_top_k: int | Iterable[int]
    map_top_k: int | Iterable[int]
    recall_top_k: int | Iterable[int]
    precision_top_k: int | Iterable[int]
    mrr: bool
    r_precision: bool
    distance: QrelsDistance
    relevance_level: int
    ignore_identical_ids: bool
    ties: Ties
    confidence_level: float | None
    n_bootstrap: int
    seed: int
    knn_backend: Literal["auto", "torch", "faiss"]
    chunk_size: int | None


@overload
def qrels_metrics(
    query: Tensor,
    query_ids: Ids,
    corpus: Tensor,
    corpus_ids: Ids,
    qrels: Qrels,
    *,
    return_per_query: Literal[False] = ...,
    **options: Unpack[QrelsArguments],
) -> dict[str, Tensor]: ...


@overload
def qrels_metrics(
    query: Tensor,
    query_ids: Ids,
    corpus: Tensor,
    corpus_ids: Ids,
    qrels: Qrels,
    *,
    return_per_query: Literal[True],
    **options: Unpack[QrelsArguments],
) -> tuple[dict[str, Tensor], RetrievalResult]: ...


def qrels_metrics(
    query: Tensor,
    query_ids: Ids,
    corpus: Tensor,
    corpus_ids: Ids,
    qrels: Qrels,
    *,
    return_per_query: bool = False,
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
) -> dict[str, Tensor] | tuple[dict[str, Tensor], RetrievalResult]:
    """trec_eval's measures of an exact search of the corpus by the queries, judged by graded qrels.

    Scores: ``cosine`` similarity, ``dot`` product, or minus the ``euclidean`` distance; a higher score ranks
    first. A judged document has its grade; an unjudged one grade 0. The binary measures count a grade
    >= ``relevance_level`` as relevant; nDCG takes the grade itself as the gain. Every measure is trec_eval's on a run
    deep enough to hold what it reads (docs/definitions.md, "Graded relevance with qrels").

    Args:
        query: ``(Q, D)`` query embeddings.
        query_ids: the ``Q`` query ids (str or int; a 1-D integer tensor), distinct.
        corpus: ``(N, D)`` corpus embeddings, same device.
        corpus_ids: the ``N`` document ids, distinct. Ids are compared as strings, as trec_eval does.
        qrels: ``{query id: {document id: grade}}`` (pytrec_eval, BEIR) or three aligned sequences
            ``(query ids, document ids, grades)``; grades are ints >= 0. Judged documents absent from the corpus
            count as relevant documents never retrieved; judgements of queries not in ``query_ids`` are left out.
        return_per_query: also return the :class:`RetrievalResult` (per-query ``values``; ``counted``: the
            queries with a judgement, which the means average over).
        ndcg_top_k: cutoffs k of ``ndcg/{k}`` (trec_eval ``ndcg_cut_k``).
        map_top_k: cutoffs k of ``map/{k}`` (``map_cut_k``).
        recall_top_k: cutoffs k of ``recall/{k}`` (``recall_k``).
        precision_top_k: cutoffs k of ``precision/{k}`` (``P_k``: divided by k).
        mrr: ``mrr``, the reciprocal rank of the first relevant document in the whole ranking (``recip_rank``).
        r_precision: ``r_precision`` (``Rprec``).
        distance: ``"cosine"``, ``"dot"`` or ``"euclidean"``.
        relevance_level: the smallest grade that is relevant, an int >= 1.
        ignore_identical_ids: leave out of each query's ranking the document whose id is the query's (BEIR).
        ties: order of documents of equal score: ``"position"`` (corpus order), ``"trec_eval"`` (document id
            descending as strings; the corpus is reordered in a copy), ``"expected"`` (the mean over every order of
            the tied documents).
        confidence_level: percentile-bootstrap interval of every key (``{key}/ci_low``, ``{key}/ci_high``).
        n_bootstrap: bootstrap resamples of the intervals.
        seed: seed of the bootstrap resamples.
        knn_backend: kNN backend of the search.
        chunk_size: rows per distance block (None: from a memory budget).

    Returns:
        ``{key: 0-dim float64 tensor}``, keys ``ndcg/{k}``, ``map/{k}``, ``recall/{k}``, ``precision/{k}``, ``mrr``,
        ``r_precision`` and ``tie_rate`` (the fraction of the cutoffs, over every measure, at which the documents
        at ranks k and k + 1 tie), each the mean over the judged queries; with ``return_per_query=True`` also the
        :class:`RetrievalResult`.

    Example:
        >>> query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> corpus = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])
        >>> qrels = {"q1": {"d2": 2, "d3": 1}, "q2": {"d1": 1}}
        >>> m = qrels_metrics(query, ["q1", "q2"], corpus, ["d1", "d2", "d3"], qrels, ndcg_top_k=2, mrr=True)
        >>> {key: round(float(value), 4) for key, value in m.items()}
        {'ndcg/2': 0.1199, 'mrr': 0.4167, 'tie_rate': 0.0}
    """
    cutoffs = checked_cutoffs(ndcg_top_k, map_top_k, recall_top_k, precision_top_k, mrr, r_precision)
    check_bool("return_per_query", return_per_query)
    options = RetrievalOptions.create(confidence_level=confidence_level, n_bootstrap=n_bootstrap, seed=seed)
    result = qrels_per_query(
        query, query_ids, corpus, corpus_ids, qrels, cutoffs,
        distance=distance, relevance_level=relevance_level, ignore_identical_ids=ignore_identical_ids, ties=ties,
        knn_backend=knn_backend, chunk_size=chunk_size,
    )  # fmt: skip
    metrics = reduce_qrels(result, options)
    return (metrics, result) if return_per_query else metrics


def reduce_qrels(result: RetrievalResult, options: RetrievalOptions) -> dict[str, Tensor]:
    """The means over the judged queries (trec_eval averages over the queries it evaluates) and, with a
    ``confidence_level``, their percentile-bootstrap intervals, resampling the judged queries."""
    keys = list(result.values)
    table = torch.stack([result.values[key] for key in keys], dim=1)
    means = _masked_mean_compute(table, result.counted, name=", ".join(keys), warn=False)
    metrics = dict(zip(keys, means.unbind(), strict=True))
    if options.confidence_level is not None:
        metrics.update(_intervals(keys, table, result.counted, result.query_labels, options))
    return metrics
