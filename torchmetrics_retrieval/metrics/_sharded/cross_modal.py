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
from torchmetrics_retrieval.functional._sets import split_query_gallery
from torchmetrics_retrieval.metrics._sharded.embedding import sharded_ranking
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, check_rows, global_rows

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
    both = {}
    for direction, is_query in (("a_to_b", is_a), ("b_to_a", ~is_a)):
        qg = split_query_gallery(placeholder, ids, is_query=is_query, is_gallery=~is_query)
        shards = ShardedSet(qg, local, owner, row, group)
        with shards.whole():
            both[direction] = sharded_ranking(shards, options)[0]
    return both
