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

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import RetrievalResult, _ranking_values, search_depth
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.types import Exclusions
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.functional.identification import _dir_at_fpir_compute
from torchmetrics_retrieval.functional.reduction import _apply_empty_target_action_compute
from torchmetrics_retrieval.functional.relevance import _count_relevant_compute, _relevance_matrix_compute
from torchmetrics_retrieval.functional.retrieval import reduce_per_query
from torchmetrics_retrieval.metrics._shard_search import gather, one_sided_top_k, symmetric_fits, symmetric_top_k
from torchmetrics_retrieval.metrics._state import _concat, _layout, _templates, deduplicate, upcast_half

__all__ = ["shardable", "sharded_compute"]


def shardable(options: RetrievalOptions) -> bool:
    """Whether every requested metric is computed from each query's top K (the sharded path)."""
    full = options.mrr or options.map_full or options.minp
    return not (full or options.needs_pairs or options.pcf_variance or options.clustering)


def _global_rows(metric: Any, group: Any) -> tuple[Tensor, dict[str, Tensor | None], Tensor, Tensor, Tensor | None]:
    """The local embeddings; the small fields of the de-duplicated global set, each row's owner rank and local
    row, and its indexes."""
    local = {spec.name: _concat(getattr(metric, spec.name)) for spec in metric._fields}
    layouts = gather(_layout(local, metric._fields, metric.device), group)
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
    counts = gather(torch.tensor([n_local], device=metric.device), group)
    owner = torch.cat([torch.full((int(c),), r, device=metric.device) for r, c in enumerate(counts)])
    row = torch.cat([torch.arange(int(c), device=metric.device) for c in counts])
    small = {
        name: None if value is None else torch.cat(gather(value, group))
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
    search = symmetric_top_k if symmetric_fits(qg, owner, k, options) else one_sided_top_k
    rows, distances, items, valid = search(qg, local, owner, row, options, k, group)
    hits = _relevance_matrix_compute(
        qg.query_labels[rows], qg.gallery_labels, items.clamp(max=n_gallery - 1), valid, options.label_comparison_fn
    )
    values = _ranking_values(options, hits, n_relevant[rows], n_candidates[rows])
    table = {"_rows": rows, "_d": distances, "_i": items, "_v": valid, "_h": hits, **values}
    gathered = {key: torch.cat(gather(value, group)) for key, value in table.items()}
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
