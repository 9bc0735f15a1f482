"""Sharded evaluation of ``EmbeddingMetrics`` under DDP: every rank keeps its own embeddings.

Only the small per-sample fields (labels, masks, ids, dataset indexes) are gathered: from them every rank builds,
identically, the de-duplicated global set (its order: by dataset index, or the rank-ordered gather order) and
knows which rank holds each sample. The searches then move queries, not the gallery: in rounds, each rank's next
block of queries is all-gathered, every rank searches all visiting queries against its own gallery shard with
the exact engine (canonical distances, global positions), and the top-K candidates go back to the owners, who
merge them by (distance, position) — the order of one exact search over the whole set. The per-query values are
gathered (a few numbers per query) and reduced as on one process, so every key is identical to it.

MRR beyond K, full MAP and mINP need the rank of relevant items in each query's whole ranking: the items before
each one are counted shard by shard, in the same rounds of visiting queries, and summed (``ranks``).
FNMR@FMR, EER, minDCF and ROC AUC share out the tiles of pairs one process computes (``tiles``, ``pairs``,
``auc``). PCF and clustering are not sharded: with either ``compute`` gathers the embeddings as
``distributed="gather"`` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._beyond_k import beyond_k
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import (
    RetrievalResult,
    _ranking_values,
    count_relevant,
    per_query_result,
    search_depth,
)
from torchmetrics_retrieval.functional._reduce import reduce_per_query
from torchmetrics_retrieval.functional._search.types import KNNResult
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.relevance import _relevance_matrix_compute
from torchmetrics_retrieval.functional.verification import PairRequest
from torchmetrics_retrieval.metrics._sharded.gather import gather_rows
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, global_problem
from torchmetrics_retrieval.metrics._sharded.pairs import sharded_pair_metrics
from torchmetrics_retrieval.metrics._sharded.ranks import ShardedRanks
from torchmetrics_retrieval.metrics._sharded.search import one_sided_top_k, symmetric_fits, symmetric_top_k

__all__ = ["shardable", "sharded_compute", "sharded_ranking"]


def shardable(options: RetrievalOptions) -> bool:
    """Whether the sharded path computes every requested metric (from each query's top K and full-ranking ranks,
    the pair passes of FNMR@FMR, EER and minDCF, and ROC AUC)."""
    # an approximate index is built on the gathered gallery (functional/_approximate.py says why)
    return not (options.pcf_variance or options.clustering or options.approximate_index is not None)


def sharded_compute(metric: Any, group: Any) -> tuple[dict[str, Tensor], RetrievalResult | None, Tensor | None]:
    """``(metrics, per-query result, sample indexes)`` of an ``EmbeddingMetrics`` whose ranks keep their samples."""
    options: RetrievalOptions = metric.options
    shards, indexes = global_problem(metric, group, options.distance)
    if options.normalize:  # row by row: the same values as normalising the gathered set
        shards = shards._replace(local=torch.nn.functional.normalize(shards.local, dim=1))
    with shards.whole():
        metrics, result = sharded_ranking(shards, options) if options.needs_ranking else ({}, None)
        metrics.update(sharded_pair_metrics(shards, PairRequest.of(options)))
    return metrics, result, indexes


#: ``(shards, options, k) -> (query rows, distances, gallery rows, valid)``: the exact top ``k`` of this rank's
#: queries.
ShardedSearch = Callable[[ShardedSet, RetrievalOptions, int], tuple[Tensor, Tensor, Tensor, Tensor]]


def sharded_ranking(
    shards: ShardedSet, options: RetrievalOptions, search: ShardedSearch | None = None
) -> tuple[dict[str, Tensor], RetrievalResult]:
    """The ranking metrics and per-query result of a problem over a sharded global set; ``search``: where the
    top K comes from when another search already found it (by default the sharded search of ``shards``)."""
    qg, local, group = shards.qg, shards.local, shards.group
    n_relevant = count_relevant(qg, options)
    n_query, n_gallery = qg.query.shape[0], qg.gallery.shape[0]
    n_candidates = qg.exclusions().count_eligible(n_query, n_gallery, local.device)
    k = min(search_depth(options, n_relevant), n_gallery)
    if search is None:
        search = symmetric_top_k if symmetric_fits(shards, k, options) else one_sided_top_k
    rows, distances, items, valid = search(shards, options, k)
    items = items.clamp(max=n_gallery - 1)  # (an empty slot's item is out of range)
    labels = qg.query_labels[rows]
    hits = _relevance_matrix_compute(labels, qg.gallery_labels, items, valid, options.label_comparison_fn)
    values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
    if options.mrr or options.map_full or options.minp:  # ranks in the full ranking: counts summed over shards
        values = beyond_k(qg, options, values, n_relevant[rows], ShardedRanks(shards, options, n_relevant, rows))
    table = {"_rows": rows, "_d": distances, "_i": items, "_v": valid, "_h": hits, **values}
    gathered = gather_rows(table, group)
    order = torch.argsort(gathered.pop("_rows"))
    gathered = {key: value[order] for key, value in gathered.items()}
    found, hits = KNNResult(*(gathered.pop(key) for key in ("_d", "_i", "_v"))), gathered.pop("_h")
    result = per_query_result(qg, options, gathered, n_relevant, found, hits)  # (what is left: the values)
    metrics = reduce_per_query(result, options)
    if options.fpir_vals:
        first_valid, first_hit = result.valid[:, 0], result.is_relevant[:, 0] & result.valid[:, 0]
        nearest = result.distances[:, 0].masked_fill(~first_valid, math.inf)
        metrics.update(_dir_at_fpir_compute(nearest, first_hit, n_relevant, options.fpir_vals))
    return metrics, result
