"""Sharded evaluation of ``EmbeddingMetrics`` under DDP: every rank keeps its own embeddings.

Only the small per-sample fields (labels, masks, ids, dataset indexes) are gathered: from them every rank builds,
identically, the de-duplicated global set (its order: by dataset index, or the rank-ordered gather order) and
knows which rank holds each sample. The searches then move queries, not the gallery: in rounds, each rank's next
block of queries is all-gathered, every rank searches all visiting queries against its own gallery shard with
the exact engine (canonical distances, global positions), and the top-K candidates go back to the owners, who
merge them by (distance, position) — the order of one exact search over the whole set. The per-query values are
gathered (a few numbers per query) and reduced as on one process, so every key is identical to it.

What needs more than the top K of each query — MRR beyond K, full MAP, mINP, the pair metrics, PCF, clustering —
is not sharded yet: with any of them ``compute`` gathers the embeddings as ``distributed="gather"`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics.utilities.distributed import gather_all_tensors

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult, _ranking_values, _search, search_depth
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._sets import QueryGallery, split_query_gallery
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute
from torchmetrics_retrieval.functional.relevance import _count_relevant_compute, _relevance_matrix_compute
from torchmetrics_retrieval.functional.retrieval import reduce_per_query
from torchmetrics_retrieval.metrics._state import _concat, _layout, _templates, deduplicate, upcast_half

__all__ = ["QUERY_BLOCK", "shardable", "sharded_compute"]

#: Queries of one rank searched per round (each round all-gathers one block of every rank).
QUERY_BLOCK = 4096


def shardable(options: RetrievalOptions) -> bool:
    """Whether every requested metric is computed from each query's top K (the sharded path)."""
    full = options.mrr or options.map_full or options.minp
    return not (full or options.needs_pairs or options.pcf_variance or options.clustering)


def _gather(tensor: Tensor, group: Any) -> list[Tensor]:
    return gather_all_tensors(tensor.contiguous(), group=group)


def _global_rows(metric: Any, group: Any) -> tuple[Tensor, dict[str, Tensor | None], Tensor, Tensor, Tensor | None]:
    """The local embeddings; the small fields of the de-duplicated global set, each row's owner rank and local
    row, and its indexes."""
    local = {spec.name: _concat(getattr(metric, spec.name)) for spec in metric._fields}
    layouts = _gather(_layout(local, metric._fields, metric.device), group)
    templates = _templates(torch.stack([layout.to(metric.device) for layout in layouts]), metric._fields)
    for spec in metric._fields:  # a rank without samples takes zero rows of the right shape and dtype
        template = templates[spec.name]
        if local[spec.name] is None and template is not None:
            local[spec.name] = torch.zeros((0, *template[1:]), dtype=template[0], device=metric.device)
    if templates["embeddings"] is None:
        raise ValueError(
            f"{metric.__class__.__name__}.compute() needs at least one sample, got none: call update() with a "
            "non-empty batch first (on at least one process)."
        )
    n_local = local["embeddings"].shape[0]  # type: ignore[union-attr]
    counts = _gather(torch.tensor([n_local], device=metric.device), group)
    owner = torch.cat([torch.full((int(c),), r, device=metric.device) for r, c in enumerate(counts)])
    row = torch.cat([torch.arange(int(c), device=metric.device) for c in counts])
    small = {
        name: None if value is None else torch.cat(_gather(value, group))
        for name, value in local.items()
        if name != "embeddings"
    }
    indexes = small.pop("indexes", None)
    small.update(_owner=owner, _row=row)
    if indexes is not None:
        small, indexes = deduplicate(small, indexes)
    embeddings = upcast_half(local["embeddings"])  # type: ignore[arg-type]
    return embeddings, small, small.pop("_owner"), small.pop("_row"), indexes  # type: ignore[return-value]


def _check_rows(local: Tensor, distance: str, group: Any) -> None:
    """The engine's checks of the rows (norms within float32 keys, no zero row for cosine), on every rank at
    once: a rank that found a bad row must not leave the others waiting in the next collective."""
    message = ""
    try:
        make_problem(local, local, distance, Exclusions(None, None, None), same_set=True, names=("embeddings", ""))
    except ValueError as error:
        message = str(error)
    flags = torch.tensor([len(message) > 0], dtype=torch.long, device=local.device)
    dist.all_reduce(flags, group=group)
    if int(flags):
        raise ValueError(message or f"`embeddings` of {int(flags)} other process(es) failed the checks of the rows.")


def _restrict_gallery(qg: QueryGallery, rows: Tensor, gallery: Tensor) -> QueryGallery:
    """The problem with its gallery cut to ``rows`` (the embeddings ``gallery``), rules and self index remapped."""
    remap = torch.full((qg.gallery.shape[0],), -1, dtype=torch.long, device=rows.device)
    remap[rows] = torch.arange(rows.numel(), device=rows.device)
    own = torch.where(qg.self_index >= 0, remap[qg.self_index.clamp(min=0)], -1)

    def side(ids: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
        return None if ids is None else (ids[0], ids[1][rows])

    return qg._replace(
        gallery=gallery,
        gallery_labels=qg.gallery_labels[rows],
        self_index=own,
        gallery_positions=qg.gallery_positions[rows],
        sequence_ids=side(qg.sequence_ids),
        search_groups=side(qg.search_groups),
        camera_labels=side(qg.camera_labels),
        same_set=False,
    )


def _merge(distances: Tensor, items: Tensor, valid: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` best of the shards' candidates, ordered by (distance, gallery row) as one exact search orders."""
    big = torch.iinfo(torch.long).max
    distances = distances.masked_fill(~valid, math.inf)
    items = items.masked_fill(~valid, big)
    by_item = torch.argsort(items, dim=1, stable=True)
    order = torch.gather(by_item, 1, torch.argsort(torch.gather(distances, 1, by_item), dim=1, stable=True))[:, :k]
    return torch.gather(distances, 1, order), torch.gather(items, 1, order), torch.gather(valid, 1, order)


def _top_k(
    qg: QueryGallery, local: Tensor, owner: Tensor, row: Tensor, options: RetrievalOptions, k: int, group: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(query rows, distances, gallery rows, valid)``: the exact top ``k`` of this rank's queries (rows of
    ``qg``), from rounds in which every rank's next block of queries visits every rank's gallery shard."""
    rank, device = dist.get_rank(group), local.device
    my_queries = torch.nonzero(owner[qg.query_positions] == rank).flatten()
    my_gallery = torch.nonzero(owner[qg.gallery_positions] == rank).flatten()
    shard = _restrict_gallery(qg, my_gallery, local[row[qg.gallery_positions[my_gallery]]])
    shard_k = min(k, my_gallery.numel())
    rounds = torch.tensor([math.ceil(my_queries.numel() / QUERY_BLOCK)], device=device)
    dist.all_reduce(rounds, op=dist.ReduceOp.MAX, group=group)
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    for b in range(int(rounds)):
        rows = my_queries[b * QUERY_BLOCK : (b + 1) * QUERY_BLOCK]
        visiting_rows = _gather(rows, group)
        visiting = torch.cat(_gather(local[row[qg.query_positions[rows]]], group))
        n_visiting = visiting.shape[0]
        found_d = torch.full((n_visiting, k), math.inf, dtype=local.dtype, device=device)
        found_i = torch.zeros((n_visiting, k), dtype=torch.long, device=device)
        found_v = torch.zeros((n_visiting, k), dtype=torch.bool, device=device)
        if n_visiting and shard_k:
            problem = shard.take(torch.cat(visiting_rows))._replace(query=visiting)
            found = _search(problem, options, shard_k, exact_distances=True)(torch.arange(n_visiting, device=device))
            width = found.indices.shape[1]
            found_d[:, :width], found_v[:, :width] = found.distances, found.valid
            found_i[:, :width] = my_gallery[found.indices]
        start = sum(r.numel() for r in visiting_rows[:rank])
        mine = slice(start, start + rows.numel())
        # every rank's candidates for every visiting query; this rank keeps those of its own block
        d, i, v = (torch.cat([part[mine] for part in _gather(t, group)], dim=1) for t in (found_d, found_i, found_v))
        parts.append((rows, *_merge(d, i, v, k)))
    rows, distances, items, valid = (torch.cat(column) for column in zip(*parts, strict=True))
    return rows, distances, items, valid


def sharded_compute(metric: Any, group: Any) -> tuple[dict[str, Tensor], RetrievalResult, Tensor | None]:
    """``(metrics, per-query result, sample indexes)`` of an ``EmbeddingMetrics`` whose ranks keep their samples."""
    options: RetrievalOptions = metric.options
    local, small, owner, row, indexes = _global_rows(metric, group)
    _check_rows(local, options.distance, group)
    if options.normalize:  # row by row: the same values as normalising the gathered set
        local = torch.nn.functional.normalize(local, dim=1)
    n = owner.numel()
    labels = small.pop("labels")
    assert labels is not None
    placeholder = local.new_zeros((1, 1)).expand(n, 1)  # the checks and the split need no embedding
    qg = split_query_gallery(placeholder, labels, **{k: v for k, v in small.items() if v is not None})
    n_relevant = _count_relevant_compute(
        qg.query_labels, qg.gallery_labels, qg.self_index, qg.sequence_ids, qg.search_groups,
        options.label_comparison_fn, qg.camera_labels,
    )  # fmt: skip
    n_query, n_gallery, device = qg.query.shape[0], qg.gallery.shape[0], local.device
    n_candidates = qg.exclusions().count_eligible(n_query, n_gallery, device)
    k = min(search_depth(options, n_relevant), n_gallery)
    rows, distances, items, valid = _top_k(qg, local, owner, row, options, k, group)
    hits = _relevance_matrix_compute(
        qg.query_labels[rows], qg.gallery_labels, items.clamp(max=n_gallery - 1), valid, options.label_comparison_fn
    )
    values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
    table = {"_rows": rows, "_d": distances, "_i": items, "_v": valid, "_h": hits, **values}
    gathered = {key: torch.cat(_gather(value, group)) for key, value in table.items()}
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
    return metrics, result, indexes
