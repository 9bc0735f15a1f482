"""The one entry point: embeddings and labels in, a flat ``dict[str, Tensor]`` of metrics out.

It chains the stages of the package, each in its own module:
``_sets`` (query/gallery split) -> ``knn`` (one exact search for every cutoff) -> ``relevance``
(hit matrix, n(q)) -> ``ranking`` (per-query kernels) -> ``reduction`` (scalars), plus the
verification, topology and clustering metrics on the same sets when asked for.

Result keys (DESIGN.md section 4): ``cmc/{k}``, ``precision/{k}``, ``recall/{k}``, ``map/{k}``,
``ndcg/{k}``, ``map`` (full ranking), ``map_at_r``, ``r_precision``, ``mrr``, ``nmi``, ``ami``,
``fnmr@fmr/{f}``, ``tar@far/{f}``, ``pcf/{r}``; with ``categories`` every key also as
``{category}/{key}``; with ``per_class=True`` every ranking key also as ``{key}/class/{label}``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import Tensor

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional._checks import check_positive_int
from torchmetrics_retrieval.functional._full_ranking import relevant_ranks
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._search.plan import symmetric_search_fits
from torchmetrics_retrieval.functional._sets import PairedIds, QueryGallery, split_query_gallery
from torchmetrics_retrieval.functional.reduction import (
    apply_empty_target_action,
    grouped_mean,
    label_names,
    masked_mean,
)
from torchmetrics_retrieval.functional.relevance import count_relevant, relevance_matrix
from torchmetrics_retrieval.functional.search import KNNResult, knn_chunks

__all__ = ["RetrievalOptions", "RetrievalResult", "retrieval_metrics", "retrieval_per_query"]

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

    def worst_queries(self, key: str, n: int = 10) -> Tensor:
        """Input-set positions of the ``n`` counted queries with the lowest ``key`` value (ties by position).

        Example:
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
    """Every requested per-query ranking value, keyed as in the result dict."""
    values: dict[str, Tensor] = {}
    kernels = (
        ("cmc", options.cmc_top_k, lambda ks: ranking.cmc_at_k(is_relevant, n_relevant, ks)),
        (
            "precision",
            options.precision_top_k,
            lambda ks: ranking.precision_at_k(
                is_relevant, n_relevant, ks, mode=options.precision_mode, n_candidates=n_candidates
            ),
        ),
        ("recall", options.recall_top_k, lambda ks: ranking.recall_at_k(is_relevant, n_relevant, ks)),
        ("map", options.map_top_k, lambda ks: ranking.map_at_k(is_relevant, n_relevant, ks)),
        ("ndcg", options.ndcg_top_k, lambda ks: ranking.ndcg_at_k(is_relevant, n_relevant, ks)),
    )
    for name, ks, kernel in kernels:
        if ks:
            table = kernel(ks)
            values.update(zip(_cutoff_keys(name, ks), table.unbind(dim=1), strict=True))
    if options.map_at_r:
        values["map_at_r"] = ranking.map_at_r(is_relevant, n_relevant)
    if options.r_precision:
        values["r_precision"] = ranking.r_precision(is_relevant, n_relevant)
    return values


def _gallery_sizes(qg: QueryGallery) -> Tensor:
    """|G(q)| for every query: the relevant count when every item matches (no pairs are formed)."""
    device = qg.query.device
    return count_relevant(
        torch.zeros(qg.query.shape[0], dtype=torch.long, device=device),
        torch.zeros(qg.gallery.shape[0], dtype=torch.long, device=device),
        self_index=qg.self_index,
        sequence_ids=qg.sequence_ids,
        search_groups=qg.search_groups,
    )


def _full_ranking_args(qg: QueryGallery, rows: Tensor, options: RetrievalOptions) -> dict[str, Any]:
    """Arguments of ``relevant_ranks`` restricted to the query rows ``rows``."""
    return {
        "query": qg.query[rows],
        "query_labels": qg.query_labels[rows],
        "gallery": qg.gallery,
        "gallery_labels": qg.gallery_labels,
        "distance": options.distance,
        "self_index": qg.self_index[rows],
        "sequence_ids": None if qg.sequence_ids is None else (qg.sequence_ids[0][rows], qg.sequence_ids[1]),
        "search_groups": None if qg.search_groups is None else (qg.search_groups[0][rows], qg.search_groups[1]),
        "label_comparison_fn": options.label_comparison_fn,
        "chunk_size": options.chunk_size,
    }


def _mrr(qg: QueryGallery, options: RetrievalOptions, within_k: Tensor, n_relevant: Tensor) -> Tensor:
    """Exact reciprocal rank over the full ranking from the one within the retrieved K (0: no hit there);
    only queries with no hit in the top K take a second, streaming pass."""
    values = within_k.clone()
    beyond = torch.nonzero((values == 0) & (n_relevant > 0)).flatten()
    if beyond.numel():
        first = relevant_ranks(
            n_relevant=n_relevant[beyond], max_relevant=1, **_full_ranking_args(qg, beyond, options)
        )[:, 0]
        values[beyond] = 1.0 / first.to(values.dtype)
    return values


def _average_precision(qg: QueryGallery, options: RetrievalOptions, n_relevant: Tensor) -> Tensor:
    """Exact full-ranking average precision from the ranks of every relevant item."""
    everyone = torch.arange(qg.query.shape[0], device=qg.query.device)
    ranks = relevant_ranks(n_relevant=n_relevant, **_full_ranking_args(qg, everyone, options)).to(torch.float64)
    position = torch.arange(1, ranks.shape[1] + 1, device=ranks.device, dtype=torch.float64)
    precision = torch.where(ranks > 0, position[None, :] / ranks.clamp(min=1), torch.zeros_like(ranks))
    return (precision.sum(dim=1) / n_relevant.clamp(min=1)).to(torch.float32)


def retrieval_per_query(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    options: RetrievalOptions | None = None,
    keep_neighbours: bool = True,
) -> RetrievalResult:
    """Per-query ranking values, retrieved ids and distances (one kNN pass for every cutoff).

    Arguments as in :func:`retrieval_metrics`, with the options given as a :class:`RetrievalOptions`.
    With ``keep_neighbours=False`` a ``(Q, K)`` neighbour table larger than ``NEIGHBOUR_TABLE_BYTES`` is
    never held whole (unless a leave-one-out search takes the symmetric pass, whose candidate buffer is
    larger): queries are searched in chunks and only their per-query values are kept (the result's
    ``indices``, ``distances``, ``valid`` and ``is_relevant`` then have zero columns). The
    search then also skips the float64 recomputation that the ranking values do not need
    (``knn_chunks(..., exact_distances=False, relevance=...)``): every rank has the same relevance as with
    exact distances, but in a kept table near-tied items of the same relevance may come in another order,
    and the distances are those of the float32 search, within its rounding bound.
    """
    options = options or RetrievalOptions()
    if options.normalize:
        query = torch.nn.functional.normalize(query, dim=1) if isinstance(query, Tensor) else query
        gallery = torch.nn.functional.normalize(gallery, dim=1) if isinstance(gallery, Tensor) else gallery
    qg = split_query_gallery(
        query,
        query_labels,
        gallery,
        gallery_labels,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
        categories=categories,
    )
    n_relevant = count_relevant(
        qg.query_labels,
        qg.gallery_labels,
        self_index=qg.self_index,
        sequence_ids=qg.sequence_ids,
        search_groups=qg.search_groups,
        label_comparison_fn=options.label_comparison_fn,
    )
    cutoffs = options.cmc_top_k + options.precision_top_k + options.map_top_k + options.recall_top_k
    k = max((*cutoffs, *options.ndcg_top_k, 1))
    if options.map_at_r or options.r_precision:
        k = max(k, int(n_relevant.max()))
    leave_one_out = gallery is None and is_query is None and is_gallery is None
    n_query, n_candidates = qg.query.shape[0], _gallery_sizes(qg)
    # A leave-one-out search whose symmetric candidate buffer fits holds more than the table anyway, and one
    # symmetric pass computes each distance once, where query chunks would compute every one twice.
    one_pass = n_query * k * _NEIGHBOUR_BYTES <= NEIGHBOUR_TABLE_BYTES or (
        leave_one_out and symmetric_search_fits(n_query, k)
    )
    if keep_neighbours or one_pass:
        ((_, found),) = _search(qg, options, k, n_query, symmetric=leave_one_out, exact_distances=keep_neighbours)
        is_relevant = relevance_matrix(
            qg.query_labels, qg.gallery_labels, found.indices, found.valid, options.label_comparison_fn
        )
        values = _ranking_values(options, is_relevant, n_relevant, n_candidates)
        within_k = ranking.reciprocal_rank(is_relevant) if options.mrr else None
    else:  # query chunks: only per-query values are kept, never the whole (Q, K) neighbour table
        rows_per_chunk = max(1, NEIGHBOUR_TABLE_BYTES // (k * _NEIGHBOUR_BYTES))
        parts: list[dict[str, Tensor]] = []
        for rows, part in _search(qg, options, k, rows_per_chunk, symmetric=leave_one_out, exact_distances=False):
            hits = relevance_matrix(
                qg.query_labels[rows], qg.gallery_labels, part.indices, part.valid, options.label_comparison_fn
            )
            chunk_values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
            if options.mrr:
                chunk_values["mrr"] = ranking.reciprocal_rank(hits)
            parts.append(chunk_values)
        values = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        within_k = values.pop("mrr", None)
        found = KNNResult(
            torch.zeros(n_query, 0, dtype=qg.query.dtype, device=qg.query.device),
            torch.zeros(n_query, 0, dtype=torch.long, device=qg.query.device),
            torch.zeros(n_query, 0, dtype=torch.bool, device=qg.query.device),
        )
        is_relevant = found.valid
    if within_k is not None:
        values["mrr"] = _mrr(qg, options, within_k, n_relevant)
    if options.map_full:
        values["map"] = _average_precision(qg, options, n_relevant)
    counted = apply_empty_target_action(torch.zeros(n_query), n_relevant, options.empty_target_action)[1]
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
    )


def _search(
    qg: QueryGallery, options: RetrievalOptions, k: int, rows_per_chunk: int, *, symmetric: bool, exact_distances: bool
) -> Iterator[tuple[Tensor, KNNResult]]:
    """kNN of the queries, chunk by chunk; ``symmetric``: the set against itself, each distance once."""
    common: dict[str, Any] = {
        "distance": options.distance,
        "backend": options.knn_backend,
        "chunk_size": options.chunk_size,
        "exact_distances": exact_distances,
        "rows_per_chunk": max(1, rows_per_chunk),
    }
    if not exact_distances:  # the metrics need the relevance of each rank only, not the exact tie order

        def relevance(rows: Tensor, items: Tensor) -> Tensor:
            return relevance_matrix(qg.query_labels[rows], qg.gallery_labels, items, None, options.label_comparison_fn)

        common["relevance"] = relevance
    if symmetric:
        return knn_chunks(
            qg.query,
            None,
            k,
            exclude_self=True,
            sequence_ids=None if qg.sequence_ids is None else qg.sequence_ids[0],
            search_groups=None if qg.search_groups is None else qg.search_groups[0],
            **common,
        )
    return knn_chunks(
        qg.query,
        qg.gallery,
        k,
        exclude_self=qg.self_index,
        sequence_ids=qg.sequence_ids,
        search_groups=qg.search_groups,
        **common,
    )


def _grouped_keys(keys: list[str], table: Tensor, counted: Tensor, groups: Tensor, pattern: str) -> dict[str, Tensor]:
    """Per-group means (one vectorised pass) named by ``pattern``; groups without a counted query are left out.

    The loop only names the results: ``{key}/class/{label}`` or ``{category}/{key}``.
    """
    distinct, means, has_counted = grouped_mean(table, counted, groups)
    return {
        pattern.format(key=key, group=group): value
        for group, row, ok in zip(label_names(distinct), means.unbind(), has_counted.tolist(), strict=True)
        if ok
        for key, value in zip(keys, row.unbind(), strict=True)
    }


def reduce_per_query(result: RetrievalResult, options: RetrievalOptions) -> dict[str, Tensor]:
    """Scalars from per-query values: the mean (or average of per-label averages), per class, per category."""
    metrics: dict[str, Tensor] = {}
    if not result.values:
        return metrics
    keys = list(result.values)
    table, counted = apply_empty_target_action(
        torch.stack([result.values[key] for key in keys], dim=1), result.n_relevant, options.empty_target_action
    )
    if options.avg_of_avgs:
        _, means, has_counted = grouped_mean(table, counted, result.query_labels)
        overall = masked_mean(means, has_counted, name=", ".join(keys))
    else:
        overall = masked_mean(table, counted, name=", ".join(keys))
    metrics.update(zip(keys, overall.unbind(), strict=True))
    if options.per_class:
        metrics.update(_grouped_keys(keys, table, counted, result.query_labels, "{key}/class/{group}"))
    if result.query_categories is not None:
        metrics.update(_grouped_keys(keys, table, counted, result.query_categories, "{group}/{key}"))
    return metrics


def _extra_metrics(
    options: RetrievalOptions,
    everything: Tensor,
    labels: Tensor,
    by_category: tuple[Tensor, Tensor] | None,
    pair_args: dict[str, Any],
) -> dict[str, Tensor]:
    """Verification, topology and clustering metrics of the same sets.

    ``everything``/``labels``: every sample (queries and gallery items); ``by_category``: the
    samples that carry a category and their categories, for per-category PCF.
    """
    metrics: dict[str, Tensor] = {}
    if options.fmr_vals:
        from torchmetrics_retrieval.functional.verification import fnmr_at_fmr

        metrics.update(fnmr_at_fmr(fmr_vals=options.fmr_vals, **pair_args))
    if options.pcf_variance:
        from torchmetrics_retrieval.functional.topology import pcf

        def pcf_keys(x: Tensor, prefix: str = "") -> dict[str, Tensor]:
            values = pcf(x, options.pcf_variance)
            return {f"{prefix}pcf/{r}": v for r, v in zip(options.pcf_variance, values.unbind(), strict=True)}

        metrics.update(pcf_keys(everything))
        if by_category is not None:
            members, categories = by_category
            names, ids = torch.unique(categories, return_inverse=True)
            for i, name in enumerate(label_names(names)):  # one PCA per category: few categories, d x d each
                if int((ids == i).sum()) >= 2:
                    metrics.update(pcf_keys(members[ids == i], f"{name}/"))
    if options.clustering:
        from torchmetrics_retrieval.functional.clustering import clustering_scores

        metrics.update(clustering_scores(everything, labels))
    return metrics


@overload
def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = ...,
    gallery_labels: Tensor | None = ...,
    *,
    return_per_query: Literal[False] = ...,
    **kwargs: Any,
) -> dict[str, Tensor]: ...


@overload
def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = ...,
    gallery_labels: Tensor | None = ...,
    *,
    return_per_query: Literal[True],
    **kwargs: Any,
) -> tuple[dict[str, Tensor], RetrievalResult | None]: ...


def retrieval_metrics(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    categories: Tensor | None = None,
    return_per_query: bool = False,
    **options: Any,
) -> dict[str, Tensor] | tuple[dict[str, Tensor], RetrievalResult | None]:
    """Retrieval metrics of embeddings, exact (DESIGN.md section 3), as a flat dict of scalars.

    Args:
        query: ``(N, D)`` embeddings. With ``gallery=None`` this is the whole set and
            ``is_query``/``is_gallery`` pick queries and gallery items (missing = all True; a
            sample that is both is left out of its own gallery, by position). Otherwise the queries.
        query_labels: ``(N,)`` or ``(N, L)`` labels, any dtype.
        gallery: ``(G, D)`` gallery embeddings, or None.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels of the gallery (with ``gallery`` only).
        is_query, is_gallery: ``(N,)`` bool masks (with ``gallery=None`` only).
        sequence_ids: items sharing the query's sequence id are left out of its gallery. One
            ``(N,)`` tensor with ``gallery=None``, else a ``(query_side, gallery_side)`` pair.
        search_groups: the gallery of a query is restricted to its own group (same forms).
        categories: ``(N,)`` (or ``(Q,)`` with a separate gallery) category of each sample; every
            metric is also reported per query category as ``{category}/{key}``.
        return_per_query: also return the :class:`RetrievalResult` (None when no ranking metric
            was asked for).
        **options: the fields of :class:`RetrievalOptions`: ``cmc_top_k=(1, 5)``,
            ``precision_top_k=(5,)``, ``map_top_k=(5,)``, ``recall_top_k=()``, ``ndcg_top_k=()``,
            ``map_at_r``, ``r_precision``, ``mrr``, ``map_full``, ``clustering`` (all False),
            ``fmr_vals=()``, ``pcf_variance=()``, ``distance="euclidean"``, ``normalize=False``,
            ``precision_mode="min_k_n"``, ``empty_target_action="skip"``, ``avg_of_avgs``,
            ``per_class``, ``label_comparison_fn=None``, ``knn_backend="auto"``, ``chunk_size=None``.

    Returns:
        ``{key: 0-dim tensor}`` with the keys listed in the module docstring.

    Example:
        >>> x = torch.tensor([[0.0], [0.3], [5.0], [5.1], [0.2]])
        >>> labels = torch.tensor([0, 0, 1, 1, 1])
        >>> metrics = retrieval_metrics(x, labels, cmc_top_k=(1,), precision_top_k=(2,), map_top_k=(), mrr=True)
        >>> {key: round(float(value), 4) for key, value in metrics.items()}
        {'cmc/1': 0.4, 'precision/2': 0.6, 'mrr': 0.6667}
    """
    opts = RetrievalOptions.create(**options)
    result = None
    metrics: dict[str, Tensor] = {}
    common: dict[str, Any] = {
        "is_query": is_query,
        "is_gallery": is_gallery,
        "sequence_ids": sequence_ids,
        "search_groups": search_groups,
    }
    if opts.needs_ranking:
        result = retrieval_per_query(
            query,
            query_labels,
            gallery,
            gallery_labels,
            categories=categories,
            options=opts,
            keep_neighbours=return_per_query,
            **common,
        )
        metrics.update(reduce_per_query(result, opts))
    if opts.fmr_vals or opts.pcf_variance or opts.clustering:
        split_query_gallery(query, query_labels, gallery, gallery_labels, categories=categories, **common)  # checks
        x = torch.nn.functional.normalize(query, dim=1) if opts.normalize else query
        y = None if gallery is None else gallery.to(x.device)
        y = torch.nn.functional.normalize(y, dim=1) if y is not None and opts.normalize else y
        everything = x if y is None else torch.cat([x, y])
        labels = query_labels if gallery_labels is None else torch.cat([query_labels, gallery_labels.to(x.device)])
        pair_args = {
            "query": x,
            "query_labels": query_labels,
            "gallery": y,
            "gallery_labels": gallery_labels,
            "distance": opts.distance,
            "label_comparison_fn": opts.label_comparison_fn,
            "chunk_size": opts.chunk_size,
            **common,
        }
        by_category = None if categories is None else (x, categories)
        metrics.update(_extra_metrics(opts, everything, labels, by_category, pair_args))
    if not metrics and not opts.needs_ranking:
        warnings.warn(
            "No metric was requested: every option that selects a metric is empty.", UserWarning, stacklevel=2
        )
    return (metrics, result) if return_per_query else metrics
