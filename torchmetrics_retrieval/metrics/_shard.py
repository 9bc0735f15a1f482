"""Sharded evaluation of ``EmbeddingMetrics`` under DDP: every rank keeps its own embeddings.

Only the small per-sample fields (labels, masks, ids, dataset indexes) are gathered: from them every rank builds,
identically, the de-duplicated global set (its order: by dataset index, or the rank-ordered gather order) and
knows which rank holds each sample. The searches then move queries, not the gallery: in rounds, each rank's next
block of queries is all-gathered, every rank searches all visiting queries against its own gallery shard with
the exact engine (canonical distances, global positions), and the top-K candidates go back to the owners, who
merge them by (distance, position) — the order of one exact search over the whole set. The per-query values are
gathered (a few numbers per query) and reduced as on one process, so every key is identical to it.

MRR beyond K, full MAP and mINP need the rank of relevant items in each query's whole ranking: the items before
each one are counted shard by shard, in the same rounds of visiting queries, and summed (``_shard_full_ranking``).
FNMR@FMR, EER and minDCF share out the tiles of pair distances one process computes (``_shard_pairs``); ROC AUC
counts, in the same rounds of visiting queries, each shard's negatives among every shard's positives
(``_shard_auc``). PCF and clustering are not sharded: with either ``compute`` gathers the embeddings as
``distributed="gather"`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._pairs.rates import RateRequest
from torchmetrics_retrieval.functional._per_query import (
    RetrievalResult,
    _full_ranking_values,
    _mrr,
    _ranking_values,
    count_relevant,
    search_depth,
)
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute
from torchmetrics_retrieval.functional.relevance import _relevance_matrix_compute
from torchmetrics_retrieval.functional.retrieval import reduce_per_query
from torchmetrics_retrieval.metrics._shard_full_ranking import ShardedRanks
from torchmetrics_retrieval.metrics._shard_gather import gather, gather_rows
from torchmetrics_retrieval.metrics._shard_search import ShardedSet, one_sided_top_k, symmetric_fits, symmetric_top_k
from torchmetrics_retrieval.metrics._state import _concat, _layout, _templates, deduplicate, upcast_half

__all__ = [
    "check_rows",
    "global_problem",
    "global_rows",
    "runs_sharded",
    "shardable",
    "sharded_compute",
    "sharded_ranking",
]


def shardable(options: RetrievalOptions) -> bool:
    """Whether the sharded path computes every requested metric (from each query's top K and full-ranking ranks,
    the pair passes of FNMR@FMR, EER and minDCF, ``_shard_pairs``, and ROC AUC, ``_shard_auc``)."""
    return not (options.pcf_variance or options.clustering)


def runs_sharded(metric: Any, distributed: str, sharded_values: bool) -> bool:
    """Whether ``metric.compute`` runs sharded: ``distributed="shard"``, syncing on compute, several processes
    in its group, and ``sharded_values``: the sharded path computes every requested value (for the retrieval
    metrics, :func:`shardable` of their options)."""
    return (
        sharded_values
        and distributed == "shard"
        and metric._to_sync
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size(metric.process_group) > 1
    )


def global_rows(metric: Any, group: Any) -> tuple[Tensor, dict[str, Tensor | None], Tensor, Tensor, Tensor | None]:
    """``(local embeddings, small fields, owner, row, indexes)``: the samples of a :class:`SampleAccumulator` (its
    first field the embeddings) as one de-duplicated global set: the small fields of every sample by field
    name (every field but those of kind ``embeddings``, which stay local), the rank that holds each sample and
    its row there, and the dataset indexes (None without them)."""
    embeddings_name = metric._fields[0].name
    index_name = next((spec.name for spec in metric._fields if spec.kind == "indexes"), None)
    local = {spec.name: _concat(getattr(metric, spec.name)) for spec in metric._fields}
    layouts = torch.stack(gather(_layout(local, metric._fields, metric.device), group))
    templates = _templates(layouts, metric._fields)
    for spec in metric._fields:  # a rank without samples takes zero rows of the right shape and dtype
        template = templates[spec.name]
        if local[spec.name] is None and template is not None:
            local[spec.name] = torch.zeros((0, *template[1:]), dtype=template[0], device=metric.device)
    if templates[embeddings_name] is None:
        raise ValueError(
            f"{metric.__class__.__name__}.compute() needs at least one sample, got none: call update() with a "
            "non-empty batch first (on at least one process)."
        )
    counts = layouts[:, 0, 0].tolist()  # the first field's rows: the embeddings'
    owner = torch.cat([torch.full((c,), r, device=metric.device) for r, c in enumerate(counts)])
    row = torch.cat([torch.arange(c, device=metric.device) for c in counts])
    small: dict[str, Tensor | None] = {spec.name: None for spec in metric._fields if spec.kind != "embeddings"}
    small.update(gather_rows({name: value for name in small if (value := local[name]) is not None}, group))
    indexes = small.pop(index_name) if index_name is not None else None
    small.update(_owner=owner, _row=row)
    if indexes is not None:
        small, indexes = deduplicate(small, indexes)
    embeddings = upcast_half(local[embeddings_name])  # type: ignore[arg-type]
    return embeddings, small, small.pop("_owner"), small.pop("_row"), indexes  # type: ignore[return-value]


def check_rows(local: Tensor, distance: str, group: Any, name: str = "embeddings") -> None:
    """The engine's checks of the rows (norms within float32 keys, no zero row for cosine), on every rank at
    once: a rank that found a bad row must not leave the others waiting in the next collective."""
    message = ""
    try:
        make_problem(local, local, distance, Exclusions(None, None, None), same_set=True, names=(name, ""))
    except ValueError as error:
        message = str(error)
    flags = torch.tensor([len(message) > 0], dtype=torch.long, device=local.device)
    dist.all_reduce(flags, group=group)
    if int(flags):
        raise ValueError(message or f"`{name}` of {int(flags)} other process(es) failed the checks of the rows.")


def global_problem(metric: Any, group: Any, distance: str) -> tuple[ShardedSet, Tensor | None]:
    """``(sharded set, indexes)`` of a metric with ``embeddings``, ``labels`` and the optional fields of
    ``EmbeddingMetrics``: :func:`global_rows`, the local rows checked on every rank, and the global set split
    into queries and gallery by its small fields (``qg``'s embeddings are placeholders, its positions global)."""
    local, small, owner, row, indexes = global_rows(metric, group)
    check_rows(local, distance, group)
    labels = small.pop("labels")
    assert labels is not None
    placeholder = local.new_zeros((1, 1)).expand(owner.numel(), 1)  # the split needs no embedding
    qg = split_query_gallery(placeholder, labels, **{k: v for k, v in small.items() if v is not None})
    return ShardedSet(qg, local, owner, row, group), indexes


def sharded_compute(metric: Any, group: Any) -> tuple[dict[str, Tensor], RetrievalResult | None, Tensor | None]:
    """``(metrics, per-query result, sample indexes)`` of an ``EmbeddingMetrics`` whose ranks keep their samples."""
    options: RetrievalOptions = metric.options
    shards, indexes = global_problem(metric, group, options.distance)
    if options.normalize:  # row by row: the same values as normalising the gathered set
        shards = shards._replace(local=torch.nn.functional.normalize(shards.local, dim=1))
    metrics, result = sharded_ranking(shards, options) if options.needs_ranking else ({}, None)
    from torchmetrics_retrieval.metrics._shard_pairs import sharded_pair_metrics

    request = RateRequest(options.eer, options.min_dcf_p_target, options.dcf_costs)
    pairs = (options.fmr_vals, request, options.distance, options.label_comparison_fn, options.chunk_size)
    metrics.update(sharded_pair_metrics(shards, *pairs, options.roc_auc))
    return metrics, result, indexes


def sharded_ranking(shards: ShardedSet, options: RetrievalOptions) -> tuple[dict[str, Tensor], RetrievalResult]:
    """The ranking metrics and per-query result of a problem over a sharded global set."""
    qg, local, group = shards.qg, shards.local, shards.group
    n_relevant = count_relevant(qg, options)
    n_query, n_gallery = qg.query.shape[0], qg.gallery.shape[0]
    n_candidates = qg.exclusions().count_eligible(n_query, n_gallery, local.device)
    k = min(search_depth(options, n_relevant), n_gallery)
    search = symmetric_top_k if symmetric_fits(shards, k, options) else one_sided_top_k
    with plan.part_of(n_query, n_gallery):  # the compiled kernels where one process would take them
        rows, distances, items, valid = search(shards, options, k)
    hits = _relevance_matrix_compute(
        qg.query_labels[rows], qg.gallery_labels, items.clamp(max=n_gallery - 1), valid, options.label_comparison_fn
    )
    values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
    if options.mrr or options.map_full or options.minp:  # ranks in the full ranking: counts summed over shards
        ranks = ShardedRanks(shards, options, n_relevant, rows)
        if options.mrr:
            values["mrr"] = _mrr(qg, options, values["mrr"], n_relevant[rows], ranks)
        if options.map_full or options.minp:
            values.update(_full_ranking_values(qg, options, n_relevant[rows], ranks))
    table = {"_rows": rows, "_d": distances, "_i": items, "_v": valid, "_h": hits, **values}
    gathered = gather_rows(table, group)
    order = torch.argsort(gathered.pop("_rows"))
    gathered = {key: value[order] for key, value in gathered.items()}
    distances, items, valid, hits = (gathered.pop(key) for key in ("_d", "_i", "_v", "_h"))
    counted = _apply_empty_target_action_compute(torch.zeros(n_query), n_relevant, options.empty_target_action)[1]
    result = RetrievalResult(
        values=gathered,
        counted=counted,
        n_relevant=n_relevant,
        indices=torch.where(valid, qg.gallery_positions[items.clamp(max=n_gallery - 1)], 0),
        distances=distances,
        valid=valid,
        is_relevant=hits,
        query_positions=qg.query_positions,
        query_labels=qg.query_labels,
        query_categories=qg.query_categories,
    )
    metrics = reduce_per_query(result, options)
    if options.fpir_vals:
        nearest = distances[:, 0].masked_fill(~valid[:, 0], math.inf)
        metrics.update(_dir_at_fpir_compute(nearest, hits[:, 0] & valid[:, 0], n_relevant, options.fpir_vals))
    return metrics, result
