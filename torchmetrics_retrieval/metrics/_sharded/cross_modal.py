"""Sharded evaluation of ``CrossModalRetrieval`` under DDP: every rank keeps its own A and B samples.

Each side is made a de-duplicated global set as ``EmbeddingMetrics`` does in sharded mode (only ids and
indexes gathered). The two sets, A then B, form one global set whose rank-local rows are the rank's A rows
followed by its B rows; a direction is that set split by ``is_query``/``is_gallery`` (A queries against the B
gallery, and the reverse), and each is searched and reduced by :func:`sharded_ranking`: the values of one
process, bit for bit (the same global order of A and of B, the same canonical distances and tie order).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._per_query import count_relevant, search_depth
from torchmetrics_retrieval.functional._sets import QueryGallery, split_query_gallery
from torchmetrics_retrieval.metrics._sharded.embedding import ShardedSearch, sharded_ranking
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, check_rows, global_rows
from torchmetrics_retrieval.metrics._sharded.search import symmetric_fits, symmetric_top_k

__all__ = ["check_same_dimension", "missing_side", "sharded_cross_modal"]


def missing_side(error: ValueError, name: str) -> ValueError:
    """The error to raise for ``error``, raised by the samples of side ``name``: it says so when no process has
    any sample of that side (and is ``error`` itself otherwise)."""
    if "needs at least one sample" not in str(error):
        return error
    return ValueError(
        f"CrossModalRetrieval.compute() needs samples of both sides, got none of side {name} (on any process)."
    )


def check_same_dimension(embeddings_a: Tensor, embeddings_b: Tensor) -> None:
    if embeddings_a.shape[1] != embeddings_b.shape[1]:
        raise ValueError(
            f"`embeddings_a` and `embeddings_b` must have the same dimension, got {embeddings_a.shape[1]} and "
            f"{embeddings_b.shape[1]}."
        )


def sharded_cross_modal(metric: Any, group: Any) -> dict[str, dict[str, Tensor]]:
    """``{"a_to_b": metrics, "b_to_a": metrics}`` of a ``CrossModalRetrieval`` whose ranks keep their samples."""
    options: RetrievalOptions = metric.options
    sides = []
    for side, name in ((metric.side_a, "A"), (metric.side_b, "B")):
        try:
            local, small, owner, row, _ = global_rows(side, group)
        except ValueError as error:
            raise missing_side(error, name) from None
        sides.append((local, small[f"ids_{side.side}"], owner, row))
    (local_a, ids_a, owner_a, row_a), (local_b, ids_b, owner_b, row_b) = sides
    check_same_dimension(local_a, local_b)
    for local, name in ((local_a, "embeddings_a"), (local_b, "embeddings_b")):
        check_rows(local, options.distance, group, name)
    if options.normalize:  # row by row: the same values as normalising the gathered sets
        local_a, local_b = (torch.nn.functional.normalize(x, dim=1) for x in (local_a, local_b))
    # on every rank its A rows, then its B rows: a B sample's local row moves past its owner's A rows
    local_a_rows = torch.cat(gather(torch.tensor([local_a.shape[0]], device=local_a.device), group))
    local = torch.cat([local_a, local_b])
    owner = torch.cat([owner_a, owner_b])
    row = torch.cat([row_a, row_b + local_a_rows[owner_b]])
    ids = torch.cat([ids_a, ids_b])  # type: ignore[list-item]
    is_a = torch.arange(owner.numel(), device=owner.device) < owner_a.numel()
    placeholder = local.new_zeros((1, 1)).expand(owner.numel(), 1)  # the split needs no embedding

    def sharded(qg: QueryGallery) -> ShardedSet:
        return ShardedSet(qg, local, owner, row, group)

    directions = {
        name: sharded(split_query_gallery(placeholder, ids, is_query=query, is_gallery=~query))
        for name, query in (("a_to_b", is_a), ("b_to_a", ~is_a))
    }
    searches = _both_directions(sharded(split_query_gallery(placeholder, ids)), directions, options)
    both = {}
    for name, shards in directions.items():
        with shards.whole():
            both[name] = sharded_ranking(shards, options, searches.get(name))[0]
    return both


def _both_directions(
    stacked: ShardedSet, directions: dict[str, ShardedSet], options: RetrievalOptions
) -> dict[str, ShardedSearch]:
    """The top K of both directions from one search of A and B stacked (``symmetric_top_k`` with ``is_b``: each
    pair of an A and a B sample computed once, where one process also computes it once), as each direction's
    search; none (each direction searched on its own) when that search does not serve."""
    n_a = directions["a_to_b"].qg.query.shape[0]
    depths = {}
    for name, shards in directions.items():
        qg = shards.qg
        depths[name] = min(search_depth(options, count_relevant(qg, options)), qg.gallery.shape[0])
    if max(depths.values()) == 0 or not symmetric_fits(stacked, max(depths.values()), options):
        return {}
    is_b = torch.arange(stacked.owner.numel(), device=stacked.owner.device) >= n_a
    with stacked.whole():
        rows, distances, items, valid = symmetric_top_k(stacked, options, max(depths.values()), is_b)
    ours = {"a_to_b": rows < n_a, "b_to_a": rows >= n_a}
    # a direction's query and gallery rows are the stacked rows less the rows of the side before it
    shift = {"a_to_b": (0, n_a), "b_to_a": (n_a, 0)}

    def search_of(name: str) -> ShardedSearch:
        def search(shards: ShardedSet, _: RetrievalOptions, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            keep, (query_shift, gallery_shift) = ours[name], shift[name]
            gallery = (items[keep, :k] - gallery_shift).clamp(0, max(shards.qg.gallery.shape[0] - 1, 0))
            return rows[keep] - query_shift, distances[keep, :k], gallery, valid[keep, :k]

        return search

    return {name: search_of(name) for name in directions}
