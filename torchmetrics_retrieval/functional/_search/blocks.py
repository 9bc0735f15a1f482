"""The query x gallery distance matrix in memory-bounded blocks, excluded pairs marked (``distance_blocks``).

The streaming passes over every pair (full-ranking ranks, verification histograms, ROC AUC) read the pairs in the
tiles of :class:`TileSchedule`, the one schedule every pass and every rank of a sharded pass follows; a block's
sides come from the budget ``plan.BLOCK_BYTES``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.keys import block_distances, exact_block, prepare, self_dots
from torchmetrics_retrieval.functional._search.types import DistanceBlock, Exclusions

__all__ = ["TileSchedule", "block_sides", "iter_blocks"]


def block_sides(n_query: int, n_gallery: int, chunk_size: int | None, bytes_per_pair: int = 16) -> tuple[int, int]:
    """Rows and columns of a block: ``rows * cols * bytes_per_pair <= plan.BLOCK_BYTES``, both capped by
    ``chunk_size``."""
    cols = min(n_gallery, plan.BLOCK_COLUMNS)
    rows = max(1, min(n_query, plan.BLOCK_BYTES // (bytes_per_pair * max(cols, 1))))
    if chunk_size is not None:
        rows, cols = min(rows, chunk_size), min(cols, chunk_size)
    return rows, max(cols, 1)


class TileSchedule(NamedTuple):
    """The tiles of the passes over every pair: row blocks against column blocks; for a set against itself
    (``symmetric``) square tiles on and above the diagonal only, each standing for its pairs both ways round.

    Example:
        >>> schedule = TileSchedule.of(5, 5, chunk_size=2, symmetric=True)
        >>> [(rs.start, cs.start) for rs, cs in schedule.tiles()]
        [(0, 0), (0, 2), (0, 4), (2, 2), (2, 4), (4, 4)]
    """

    row_blocks: list[slice]
    col_blocks: list[slice]
    symmetric: bool

    @classmethod
    def of(
        cls, n_rows: int, n_cols: int, chunk_size: int | None, symmetric: bool, bytes_per_pair: int = 5
    ) -> TileSchedule:
        """The schedule of ``n_rows`` x ``n_cols`` pairs (``symmetric``: a set of ``n_rows`` against itself);
        ``bytes_per_pair``: what a pass holds per pair of a one-sided tile (its rows are capped at
        ``plan.KEY_TILE_ROWS``, which a kernel reads from cache)."""
        if symmetric:
            side = min(plan.SYMMETRIC_KEY_TILE, chunk_size or plan.SYMMETRIC_KEY_TILE)
            blocks = _cut(n_rows, side)
            return cls(blocks, blocks, True)
        rows, cols = block_sides(n_rows, n_cols, chunk_size, bytes_per_pair)
        return cls(_cut(n_rows, min(rows, plan.KEY_TILE_ROWS)), _cut(n_cols, cols), False)

    def tiles(self, first_rows_only: bool = False) -> list[tuple[slice, slice]]:
        """``(rows, cols)`` of every tile, row blocks outer (``first_rows_only``: the first row block's)."""
        row_blocks = self.row_blocks[:1] if first_rows_only else self.row_blocks
        return [(rs, cs) for rs in row_blocks for cs in self.col_blocks if not (self.symmetric and cs.start < rs.start)]

    def mirrored(self, rows: slice, cols: slice) -> bool:
        """Whether the tile also stands for the pairs (column, row): symmetric and off the diagonal."""
        return self.symmetric and rows != cols


def _cut(n: int, size: int) -> list[slice]:
    return [slice(a, min(a + size, n)) for a in range(0, n, size)]


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
