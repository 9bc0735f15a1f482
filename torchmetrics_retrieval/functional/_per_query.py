"""Per-query ranking values of a checked problem: one kNN search serves every cutoff, then relevance, the
ranking kernels, and the streaming full-ranking passes for ``mrr`` beyond K and full ``map``.

Two ways through the search, with the same values:

* :func:`_one_pass`: the whole ``(Q, K)`` neighbour table at once (kept for the caller, or small enough);
* :func:`_chunked`: query chunks reduced to their per-query values as they come, so a large table is never
  held whole; the search then skips the float64 ordering that the values cannot see (near ties of one
  relevance keep their float32 order).

With full ``map`` and no neighbour table wanted there is no search at all (:func:`_from_full_ranks`): the
full-ranking pass gives the rank of every relevant item, and the hit matrix within K is where those ranks fall.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional._beyond_k import beyond_k
from torchmetrics_retrieval.functional._checks import check_positive_int
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._progress import section
from torchmetrics_retrieval.functional._ranks.count import relevant_ranks
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.half_rows import values_dtype
from torchmetrics_retrieval.functional._search.plan import lazy_float64, symmetric_search_fits
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute
from torchmetrics_retrieval.functional.relevance import _count_relevant_compute, _relevance_matrix_compute

__all__ = ["RetrievalResult", "count_relevant", "per_query", "per_query_result", "search_depth"]

#: Largest (Q, K) neighbour table (distances, indices, validity, hits) held at once when the caller does not
#: ask for the neighbours themselves.
NEIGHBOUR_TABLE_BYTES = 64 * 2**20
_NEIGHBOUR_BYTES = 8 + 8 + 1 + 1  # per slot: distance (up to float64), int64 index, valid, hit


@dataclass
class RetrievalResult:
    """Per-query outcome of a retrieval evaluation (``retrieval_per_query``).

    Attributes:
        values: flat key (as in the result dict) -> ``(Q,)`` value of each query, before the
            empty-target rule.
        counted: ``(Q,)`` bool, the queries that count in averages under ``empty_target_action``.
        n_relevant: ``(Q,)`` int64 number of relevant items in each query's gallery.
        indices: ``(Q, K)`` int64 positions, *in the input set*, of the retrieved items.
        distances: ``(Q, K)`` their distances (+inf in invalid slots).
        valid: ``(Q, K)`` bool, False where the query's gallery had fewer than K items.
        is_relevant: ``(Q, K)`` bool hit matrix.
        query_positions: ``(Q,)`` positions of the queries in the input set.
        query_labels: ``(Q,)`` or ``(Q, L)`` labels of the queries.
        query_categories: ``(Q,)`` categories of the queries, or None.
        nearest: ``(Q,)`` canonical distance to each query's nearest gallery item (+inf without one), when
            ``fpir_vals`` asked for it; else None.
        nearest_relevant: ``(Q,)`` bool, whether that item is relevant (with ``nearest``).
    """

    values: dict[str, Tensor]
    counted: Tensor
    n_relevant: Tensor
    indices: Tensor
    distances: Tensor
    valid: Tensor
    is_relevant: Tensor
    query_positions: Tensor
    query_labels: Tensor
    query_categories: Tensor | None
    nearest: Tensor | None = None
    nearest_relevant: Tensor | None = None

    def worst_queries(self, key: str, n: int = 10) -> Tensor:
        """Input-set positions of the ``n`` counted queries with the lowest ``key`` value (ties by position).

        Example:
            >>> from torchmetrics_retrieval.functional import retrieval_metrics
            >>> x = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]])
            >>> _, res = retrieval_metrics(x, torch.tensor([0, 0, 1, 1, 1]), cmc_top_k=(1,), return_per_query=True)
            >>> res.values["cmc/1"].tolist()  # q0, q1 and q4 miss at rank 1; ties go by position
            [0.0, 0.0, 1.0, 1.0, 0.0]
            >>> res.worst_queries("cmc/1", 2).tolist()
            [0, 1]
        """
        if key not in self.values:
            raise ValueError(f"`key` must be one of {sorted(self.values)}, got {key!r}.")
        check_positive_int("n", n)
        values = self.values[key].masked_fill(~self.counted, float("inf"))
        order = torch.sort(values, stable=True).indices[: min(n, int(self.counted.sum()))]
        return self.query_positions[order]


def _cutoff_keys(name: str, ks: Iterable[int]) -> list[str]:
    return [f"{name}/{k}" for k in ks]


def _ranking_values(
    options: RetrievalOptions, is_relevant: Tensor, n_relevant: Tensor, n_candidates: Tensor
) -> dict[str, Tensor]:
    """Every requested per-query ranking value within the retrieved K, keyed as in the result dict (``mrr``
    here is the reciprocal rank within K; :func:`_mrr` completes it)."""
    values: dict[str, Tensor] = {}
    kernels = (
        ("cmc", options.cmc_top_k, lambda ks: ranking._cmc_at_k_compute(is_relevant, n_relevant, ks)),
        (
            "precision",
            options.precision_top_k,
            lambda ks: ranking._precision_at_k_compute(
                is_relevant, n_relevant, ks, options.precision_mode, n_candidates
            ),
        ),
        ("recall", options.recall_top_k, lambda ks: ranking._recall_at_k_compute(is_relevant, n_relevant, ks)),
        ("map", options.map_top_k, lambda ks: ranking._map_at_k_compute(is_relevant, n_relevant, ks)),
        ("ndcg", options.ndcg_top_k, lambda ks: ranking._ndcg_at_k_compute(is_relevant, n_relevant, ks)),
    )
    for name, ks, kernel in kernels:
        if ks:
            table = kernel(ks)
            values.update(zip(_cutoff_keys(name, ks), table.unbind(dim=1), strict=True))
    if options.map_at_r:
        values["map_at_r"] = ranking._map_at_r_compute(is_relevant, n_relevant)
    if options.r_precision:
        values["r_precision"] = ranking._r_precision_compute(is_relevant, n_relevant)
    if options.mrr:
        values["mrr"] = ranking._reciprocal_rank_compute(is_relevant)
    return values


def _search(
    qg: QueryGallery, options: RetrievalOptions, k: int, exact_distances: bool, lazy: bool | None = None
) -> Search:
    """The kNN search of the problem; a set against itself takes the symmetric path (each distance once)."""
    sets = (qg.query,) if qg.same_set else (qg.query, qg.gallery)
    if lazy is None:
        lazy = lazy_float64(*sets)  # a large set: no float64 copy, only the candidates' rows are upcast
    problem = make_problem(qg.query, qg.gallery, options.distance, qg.exclusions(), qg.same_set, lazy64=lazy)
    relevance = None
    if not exact_distances:  # the metrics need the relevance of each rank only, not the exact tie order

        def relevance(rows: Tensor, items: Tensor) -> Tensor:
            return _relevance_matrix_compute(
                qg.query_labels[rows], qg.gallery_labels, items, None, options.label_comparison_fn
            )

    return Search.prepare(
        problem,
        k,
        backend=options.knn_backend,
        chunk_size=options.chunk_size,
        exact_distances=exact_distances,
        relevance=relevance,
        precision=options.search_precision,
    )


def _one_pass(
    qg: QueryGallery,
    options: RetrievalOptions,
    k: int,
    n_relevant: Tensor,
    n_candidates: Tensor,
    exact: bool,
    found: KNNResult | None = None,
) -> tuple[dict[str, Tensor], KNNResult, Tensor]:
    """Values, neighbour table and hit matrix from one search of every query (or its result ``found``)."""
    if found is None:
        found = _search(qg, options, k, exact)(torch.arange(qg.query.shape[0], device=qg.query.device))
    is_relevant = _relevance_matrix_compute(
        qg.query_labels, qg.gallery_labels, found.indices, found.valid, options.label_comparison_fn
    )
    return _ranking_values(options, is_relevant, n_relevant, n_candidates), found, is_relevant


def _chunked(
    qg: QueryGallery, options: RetrievalOptions, k: int, n_relevant: Tensor, n_candidates: Tensor
) -> dict[str, Tensor]:
    """Values from query chunks of at most ``NEIGHBOUR_TABLE_BYTES`` of neighbours each."""
    search = _search(qg, options, k, exact_distances=False)
    rows_per_chunk = max(1, NEIGHBOUR_TABLE_BYTES // (k * _NEIGHBOUR_BYTES))
    parts: list[dict[str, Tensor]] = []
    for rows in torch.arange(qg.query.shape[0], device=qg.query.device).split(rows_per_chunk):
        part = search(rows)
        hits = _relevance_matrix_compute(
            qg.query_labels[rows], qg.gallery_labels, part.indices, part.valid, options.label_comparison_fn
        )
        values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
        # a copy: the column as a view would keep the chunk's whole (rows, K) table alive until the end
        values[_NEAREST], values[_NEAREST_HIT] = part.indices[:, 0].clone(), hits[:, 0] & part.valid[:, 0]
        parts.append(values)
    return _joined(parts)


def _joined(parts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The per-query values of consecutive query chunks, as one table."""
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def _from_full_ranks(
    qg: QueryGallery, options: RetrievalOptions, k: int, n_relevant: Tensor, n_candidates: Tensor
) -> dict[str, Tensor]:
    """Every ranking value from one full-ranking pass, without a search: the hit matrix within K is where the
    ranks of the relevant items fall (ranks ordered by (distance, gallery position), as the search orders them),
    built for as many queries at a time as a chunked search takes. ``mrr``, ``map`` and ``minp`` read the same
    ranks."""
    full = relevant_ranks(qg, n_relevant, options)  # (Q, max n(q)), 0 past a query's n(q)
    parts: list[dict[str, Tensor]] = []
    every = torch.arange(qg.query.shape[0], device=full.device)
    step = max(1, NEIGHBOUR_TABLE_BYTES // (max(k, full.shape[1]) * _NEIGHBOUR_BYTES))
    for rows in every.split(step) or (every,):  # (one empty chunk without a query: every key still present)
        ranks = full[rows]
        hits = torch.zeros(rows.numel(), k + 1, dtype=torch.bool, device=full.device)  # column k: beyond K
        hits.scatter_(1, torch.where(ranks > 0, ranks.clamp(max=k + 1) - 1, k), True)
        parts.append(_ranking_values(options, hits[:, :k], n_relevant[rows], n_candidates[rows]))
    values = _joined(parts)

    def known(rows: Tensor, most: int | None, last: bool) -> Tensor:
        assert not last  # with full ``map`` every rank is known; ``minp`` reads the last one itself
        return full[rows, :most]

    return beyond_k(qg, options, values, n_relevant, known)


#: Keys of the chunked pass's per-query nearest item and its relevance (taken out before the values are returned).
_NEAREST, _NEAREST_HIT = "_nearest", "_nearest_relevant"


def _nearest_distances(qg: QueryGallery, options: RetrievalOptions, items: Tensor, found: Tensor) -> Tensor:
    """The canonical distance of each query to its nearest gallery item (the value ``knn`` reports), +inf where
    the query's gallery is empty."""
    lazy = lazy_float64(*((qg.query,) if qg.same_set else (qg.query, qg.gallery)))
    problem = make_problem(qg.query, qg.gallery, options.distance, qg.exclusions(), qg.same_set, lazy64=lazy)
    rows = torch.arange(qg.query.shape[0], device=qg.query.device)
    distances = canonical_distances(problem, rows, rows, items).to(problem.dtype)
    return distances.masked_fill(~found, float("inf"))


def search_depth(options: RetrievalOptions, n_relevant: Tensor) -> int:
    """The K of the one kNN search: the largest cutoff, at least 1, and n(q) for MAP@R and R-precision."""
    cutoffs = options.cmc_top_k + options.precision_top_k + options.map_top_k + options.recall_top_k
    k = max((*cutoffs, *options.ndcg_top_k, 1))
    if options.map_at_r or options.r_precision:
        k = max(k, int(n_relevant.max()))
    return k


def count_relevant(qg: QueryGallery, options: RetrievalOptions) -> Tensor:
    """``(Q,)`` n(q): the relevant items of each query's gallery, every exclusion rule applied."""
    return _count_relevant_compute(
        qg.query_labels,
        qg.gallery_labels,
        qg.self_index,
        qg.sequence_ids,
        qg.search_groups,
        options.label_comparison_fn,
        qg.camera_labels,
    )


def per_query(
    qg: QueryGallery,
    options: RetrievalOptions,
    keep_neighbours: bool,
    neighbours: KNNResult | None = None,
    listed: bool = False,
) -> RetrievalResult:
    """Per-query values of a checked problem (what ``retrieval_per_query`` documents); ``neighbours``: the
    result of its search when another search already gave it (ordered as its K = ``search_depth`` columns), or,
    with ``listed``, the user's neighbour lists (``_given``: at least K columns; nothing is ranked beyond them, so
    ``mrr`` is the reciprocal rank within the list)."""
    n_relevant = count_relevant(qg, options)
    n_query, device = qg.query.shape[0], qg.query.device
    n_candidates = qg.exclusions().count_eligible(n_query, qg.gallery.shape[0], device)  # |G(q)|
    k = search_depth(options, n_relevant)
    # A leave-one-out search whose symmetric candidate buffer fits holds more than the table anyway, and one
    # symmetric pass computes each distance once, where query chunks would compute every one twice.
    one_pass = (
        neighbours is not None
        or n_query * k * _NEIGHBOUR_BYTES <= NEIGHBOUR_TABLE_BYTES
        or (qg.same_set and symmetric_search_fits(n_query, k))
    )
    empty = KNNResult(
        torch.zeros(n_query, 0, dtype=values_dtype(qg.query), device=device),
        torch.zeros(n_query, 0, dtype=torch.long, device=device),
        torch.zeros(n_query, 0, dtype=torch.bool, device=device),
    )
    # full ``map`` ranks every relevant item: no search needed unless the caller wants the neighbours themselves
    # (or the nearest one, for open-set identification)
    if options.map_full and not keep_neighbours and neighbours is None and not options.fpir_vals:
        values = _from_full_ranks(qg, options, k, n_relevant, n_candidates)
        return per_query_result(qg, options, values, n_relevant, empty, empty.valid)
    with section("kNN search", n_query, unit="query"):
        if keep_neighbours or one_pass:
            values, found, is_relevant = _one_pass(
                qg, options, k, n_relevant, n_candidates, exact=keep_neighbours, found=neighbours
            )
        else:
            values, found = _chunked(qg, options, k, n_relevant, n_candidates), empty
            is_relevant = found.valid
    nearest = nearest_relevant = None
    if (keep_neighbours or one_pass) and found.indices.shape[1] == 0:  # no query has a gallery item
        nearest_item, nearest_relevant = torch.zeros_like(n_relevant), torch.zeros_like(n_relevant, dtype=torch.bool)
    elif keep_neighbours or one_pass:
        nearest_item, nearest_relevant = found.indices[:, 0], is_relevant[:, 0] & found.valid[:, 0]
    else:
        nearest_item, nearest_relevant = values.pop(_NEAREST), values.pop(_NEAREST_HIT)
    if options.fpir_vals:
        nearest = _nearest_distances(qg, options, nearest_item, n_candidates > 0)
    values = beyond_k(qg, options, values, n_relevant, mrr_beyond=not listed)
    return per_query_result(qg, options, values, n_relevant, found, is_relevant, nearest, nearest_relevant)


def per_query_result(
    qg: QueryGallery,
    options: RetrievalOptions,
    values: dict[str, Tensor],
    n_relevant: Tensor,
    found: KNNResult,
    is_relevant: Tensor,
    nearest: Tensor | None = None,
    nearest_relevant: Tensor | None = None,
) -> RetrievalResult:
    """The per-query result of ``per_query`` (or of sharded mode, from every rank's rows), with the counted queries
    under the empty-target rule; ``found``'s items index ``qg.gallery``."""
    counted = _apply_empty_target_action_compute(
        torch.zeros(n_relevant.shape[0]), n_relevant, options.empty_target_action
    )[1]
    return RetrievalResult(
        values=values,
        counted=counted,
        n_relevant=n_relevant,
        indices=torch.where(found.valid, qg.gallery_positions[found.indices], 0),
        distances=found.distances,
        valid=found.valid,
        is_relevant=is_relevant,
        query_positions=qg.query_positions,
        query_labels=qg.query_labels,
        query_categories=qg.query_categories,
        nearest=nearest,
        nearest_relevant=nearest_relevant if options.fpir_vals else None,
    )
