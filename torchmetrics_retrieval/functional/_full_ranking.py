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

from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._search.blocks import iter_blocks
from torchmetrics_retrieval.functional._search.keys import order_key
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import _label_match_compute

__all__ = ["relevant_ranks"]

_PAD = torch.iinfo(torch.int64).max
_BUDGET_ENTRIES = 1 << 24  # rows x max n(q) held at once


def _ranks_of_chunk(qg: QueryGallery, n_max: int, options: RetrievalOptions) -> Tensor:
    n_rows = qg.query.shape[0]
    device = qg.query.device
    keys = torch.full((n_rows, n_max + 1), _PAD, dtype=torch.int64, device=device)
    filled = torch.zeros(n_rows, dtype=torch.long, device=device)

    def blocks() -> Iterator[tuple[slice, Tensor, Tensor, Tensor]]:
        """(query rows, sort keys, relevant and eligible, non-relevant and eligible) of every block."""
        # exact: the distances knn reports, so ties are ordered as in the retrieved lists
        tiles = iter_blocks(qg.query, qg.gallery, options.distance, qg.exclusions(), options.chunk_size, exact=True)
        for block in tiles:
            qs, gs = block.query_slice, block.gallery_slice
            relevant = _label_match_compute(qg.query_labels[qs], qg.gallery_labels[gs], options.label_comparison_fn)
            eligible = block.eligible if block.eligible is not None else torch.ones_like(relevant)
            positions = torch.arange(gs.start, gs.stop, device=device)
            yield qs, order_key(block.distances, positions[None, :]), relevant & eligible, ~relevant & eligible

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
    qg: QueryGallery, n_relevant: Tensor, options: RetrievalOptions, max_relevant: int | None = None
) -> Tensor:
    """1-based ranks of the first ``max_relevant`` relevant items of every query of ``qg`` in its full ranking.

    Ties in distance are ordered by gallery position, as everywhere in the package.

    Returns:
        ``(Q, m)`` int64 ranks in increasing order, 0 past the query's n(q) relevant items, where
        ``m = min(max_relevant, max n(q))``.
    """
    n_query = qg.query.shape[0]
    n_max = int(n_relevant.max()) if n_query else 0
    if n_max == 0:
        return torch.zeros(n_query, 0, dtype=torch.long, device=qg.query.device)
    kept = n_max if max_relevant is None else min(max_relevant, n_max)
    rows = max(1, _BUDGET_ENTRIES // (n_max + 1))
    chunks = [
        _ranks_of_chunk(qg.take(part), n_max, options)[:, :kept]
        for part in torch.arange(n_query, device=qg.query.device).split(rows)
    ]
    return torch.cat(chunks)
