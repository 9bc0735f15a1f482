"""Ranks of relevant items in the *whole* ranking of each query, without retrieving everything.

Used for exact MRR when a query's first relevant item lies beyond the retrieved K, and for the
full-ranking average precision (``map``). Two streaming passes over the distance blocks:

1. collect the relevant items of each query as sortable keys (distance, then gallery position);
2. for every non-relevant item, find with ``searchsorted`` how many relevant items it precedes,
   and accumulate those counts in a per-query histogram.

The rank of the j-th relevant item (1-based, in (distance, position) order) is then
``j + (number of non-relevant items ranked before it)``. Memory: O(rows x max n(q)) per query
chunk plus one distance block; never the full query x gallery matrix.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from torchmetrics_retrieval.functional.relevance import LabelComparisonFn, label_match
from torchmetrics_retrieval.functional.search import Distance, distance_blocks

__all__ = ["relevant_ranks"]

_PAD = torch.iinfo(torch.int64).max
_BUDGET_ENTRIES = 1 << 24  # rows x max n(q) held at once


def _sort_keys(distances: Tensor, gallery_positions: Tensor) -> Tensor:
    """Order-preserving int64 keys of (distance, gallery position) pairs (distances read as float32)."""
    bits = distances.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # monotone in the float value
    return ordered * (1 << 32) + gallery_positions


def _ranks_of_chunk(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor,
    gallery_labels: Tensor,
    n_max: int,
    *,
    distance: Distance,
    self_index: Tensor,
    sequence_ids: tuple[Tensor, Tensor] | None,
    search_groups: tuple[Tensor, Tensor] | None,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
) -> Tensor:
    n_rows = query.shape[0]
    device = query.device
    keys = torch.full((n_rows, n_max + 1), _PAD, dtype=torch.int64, device=device)
    filled = torch.zeros(n_rows, dtype=torch.long, device=device)

    def blocks() -> Iterator[tuple[slice, Tensor, Tensor, Tensor]]:
        """(query rows, sort keys, relevant and eligible, non-relevant and eligible) of every block."""
        tiles = distance_blocks(
            query,
            gallery,
            distance=distance,
            self_index=self_index,
            sequence_ids=sequence_ids,
            search_groups=search_groups,
            chunk_size=chunk_size,
            exact=True,  # the distances knn reports, so ties are ordered as in the retrieved lists
        )
        for block in tiles:
            qs, gs = block.query_slice, block.gallery_slice
            relevant = label_match(query_labels[qs], gallery_labels[gs], label_comparison_fn)
            eligible = block.eligible if block.eligible is not None else torch.ones_like(relevant)
            positions = torch.arange(gs.start, gs.stop, device=device)
            yield qs, _sort_keys(block.distances, positions[None, :]), relevant & eligible, ~relevant & eligible

    # Pass 1: the relevant items' keys, appended row by row.
    for qs, block_keys, positive, _ in blocks():
        rows, cols = torch.nonzero(positive, as_tuple=True)
        slot = filled[qs][rows] + positive.cumsum(dim=1)[rows, cols] - 1
        keys[torch.arange(qs.start, qs.stop, device=device)[rows], slot] = block_keys[rows, cols]
        filled[qs] += positive.sum(dim=1)
    keys = keys.sort(dim=1).values

    # Pass 2: how many non-relevant items precede each relevant one.
    before = torch.zeros(n_rows, n_max + 1, dtype=torch.long, device=device)
    for qs, block_keys, _, negative in blocks():
        bucket = torch.searchsorted(keys[qs], block_keys)
        before[qs].scatter_add_(1, bucket, negative.long())
    preceding_negatives = before.cumsum(dim=1)[:, :n_max]
    ranks = torch.arange(1, n_max + 1, device=device)[None, :] + preceding_negatives
    return torch.where(torch.arange(n_max, device=device)[None, :] < filled[:, None], ranks, 0)


def relevant_ranks(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor,
    gallery_labels: Tensor,
    n_relevant: Tensor,
    *,
    distance: Distance = "euclidean",
    self_index: Tensor | None = None,
    sequence_ids: tuple[Tensor, Tensor] | None = None,
    search_groups: tuple[Tensor, Tensor] | None = None,
    label_comparison_fn: LabelComparisonFn | None = None,
    max_relevant: int | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """1-based ranks of the first ``max_relevant`` relevant items of every query in its full ranking.

    Ties in distance are ordered by gallery position, as everywhere in the package.

    Returns:
        ``(Q, m)`` int64 ranks in increasing order, 0 past the query's n(q) relevant items, where
        ``m = min(max_relevant, max n(q))``.
    """
    n_query = query.shape[0]
    device = query.device
    if self_index is None:
        self_index = torch.full((n_query,), -1, dtype=torch.long, device=device)
    n_max = int(n_relevant.max()) if n_query else 0
    if n_max == 0:
        return torch.zeros(n_query, 0, dtype=torch.long, device=device)
    kept = n_max if max_relevant is None else min(max_relevant, n_max)
    rows = max(1, _BUDGET_ENTRIES // (n_max + 1))
    chunks = []
    for q0 in range(0, n_query, rows):
        q1 = min(q0 + rows, n_query)
        part = slice(q0, q1)
        chunk = _ranks_of_chunk(
            query[part],
            query_labels[part],
            gallery,
            gallery_labels,
            n_max,
            distance=distance,
            self_index=self_index[part],
            sequence_ids=None if sequence_ids is None else (sequence_ids[0][part], sequence_ids[1]),
            search_groups=None if search_groups is None else (search_groups[0][part], search_groups[1]),
            label_comparison_fn=label_comparison_fn,
            chunk_size=chunk_size,
        )
        chunks.append(chunk[:, :kept])
    return torch.cat(chunks)
