"""The query x gallery distance matrix in memory-bounded blocks, excluded pairs marked (``distance_blocks``).

The streaming passes over every pair (full-ranking ranks, verification histograms) read the matrix through
these blocks; a block's sides come from the budget ``plan.BLOCK_BYTES``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.keys import block_distances, exact_block, prepare, self_dots
from torchmetrics_retrieval.functional._search.types import DistanceBlock, Exclusions

__all__ = ["block_sides", "iter_blocks"]


def block_sides(n_query: int, n_gallery: int, chunk_size: int | None, bytes_per_pair: int = 16) -> tuple[int, int]:
    """Rows and columns of a block: ``rows * cols * bytes_per_pair <= plan.BLOCK_BYTES``, both capped by
    ``chunk_size``."""
    cols = min(n_gallery, plan.BLOCK_COLUMNS)
    rows = max(1, min(n_query, plan.BLOCK_BYTES // (bytes_per_pair * max(cols, 1))))
    if chunk_size is not None:
        rows, cols = min(rows, chunk_size), min(cols, chunk_size)
    return rows, max(cols, 1)


def iter_blocks(
    query: Tensor, gallery: Tensor, distance: str, exclusions: Exclusions, chunk_size: int | None, exact: bool
) -> Iterator[DistanceBlock]:
    """The blocks of checked inputs, row blocks outer (what ``search.distance_blocks`` documents)."""
    rows, cols = block_sides(query.shape[0], gallery.shape[0], chunk_size, bytes_per_pair=32 if exact else 16)
    if exact:
        query64, gallery64 = query.to(torch.float64), gallery.to(torch.float64)
        query_sq64, gallery_sq64 = self_dots(query64), self_dots(gallery64)
    else:
        gallery_prepared, gallery_sq = prepare(gallery, distance)
    for q0 in range(0, query.shape[0], rows):
        q_slice = slice(q0, min(q0 + rows, query.shape[0]))
        if not exact:
            q, q_sq = prepare(query[q_slice], distance)
        for g0 in range(0, gallery.shape[0], cols):
            g_slice = slice(g0, min(g0 + cols, gallery.shape[0]))
            if exact:
                d = exact_block(
                    query64[q_slice], query_sq64[q_slice], gallery64[g_slice], gallery_sq64[g_slice], distance
                ).to(query.dtype)
            else:
                g_sq = None if gallery_sq is None else gallery_sq[g_slice]
                with ieee_float32_matmul():  # not inside a yield: the consumer runs with its own settings
                    d = block_distances(q, q_sq, gallery_prepared[g_slice], g_sq, distance)
            eligible = exclusions.eligible(q_slice, g_slice, (d.shape[0], d.shape[1]), query.device)
            if eligible is not None:
                d.masked_fill_(~eligible, float("inf"))
            yield DistanceBlock(q_slice, g_slice, d, eligible)
