"""The one tile schedule of the passes over every pair (``_search.blocks.TileSchedule``) shared out over the ranks
of a sharded set: each tile is computed by exactly one rank, so each pair is read once, and a set against itself
keeps one process's symmetric tiles (half the products).

Column block ``j`` is held by one rank (its rows fetched from their owners once, at the start); the blocks go to
the ranks largest first, each to the rank with the fewest pairs so far, so that the ranks' shares of a symmetric
triangle differ by at most one block. The row blocks then travel in order, a few MiB at a time: each fetch is
all-gathered (every rank sends its own rows of it) and every rank computes its tiles of those row blocks against
the column blocks it holds. A rank holds its column blocks (about ``1 / P`` of the gallery) and the row blocks of
one fetch: never the whole set. What travels is a *payload* per sample, chosen by the pass: the float32 stage rows
of the key passes, the rows themselves for ROC AUC. The pass also chooses what a block is kept as (``Forms``: the
operands of its products, made once per held column block and once per row block, never per tile).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet

__all__ = ["FETCH_BYTES", "Forms", "ShardedTiles", "Tile"]

#: Payload bytes of the blocks fetched in one collective (:meth:`ShardedTiles.tiles`, and the held column blocks).
FETCH_BYTES = 8 * 2**20

Left = TypeVar("Left")
Right = TypeVar("Right")


@dataclass(frozen=True)
class Forms(Generic[Left, Right]):
    """What a block of payload rows is kept as: ``rows`` for a row block, ``cols`` for a held column block. Each
    makes tensors of its own (not views of the fetched payload, which is let go)."""

    rows: Callable[[Tensor], Left]
    cols: Callable[[Tensor], Right]


@dataclass(frozen=True)
class Tile(Generic[Left, Right]):
    """One tile of this rank: its global ``rows`` and ``cols``, their blocks in the pass's forms (``right`` None: a
    tile on the diagonal of a set against itself, whose columns are its rows), and whether it also stands for the
    pairs (column, row)."""

    rows: slice
    cols: slice
    left: Left
    right: Right | None
    mirrored: bool

    @property
    def n_pairs(self) -> int:
        """The ordered pairs the tile stands for."""
        return (self.rows.stop - self.rows.start) * (self.cols.stop - self.cols.start) * (2 if self.mirrored else 1)


def _holders(schedule: TileSchedule, world: int) -> list[int]:
    """The rank that holds each column block: largest first, to the rank with the fewest pairs so far (ties: the
    lower rank), so that every rank decides the same."""

    def pairs(j: int) -> int:
        cols = schedule.col_blocks[j]
        rows = [rs for rs in schedule.row_blocks if not (schedule.symmetric and cols.start < rs.start)]
        return (cols.stop - cols.start) * sum(rs.stop - rs.start for rs in rows)

    load, holders = [0] * world, [0] * len(schedule.col_blocks)
    for j in sorted(range(len(schedule.col_blocks)), key=lambda j: (-pairs(j), j)):
        holders[j] = min(range(world), key=lambda r: (load[r], r))
        load[holders[j]] += pairs(j)
    return holders


class ShardedTiles(Generic[Left, Right]):
    """This rank's tiles of ``schedule`` over ``shards``, with ``payload`` (one row per local sample) fetched for
    their rows and columns and kept in ``forms``. Every rank must make it and iterate it to the end together (each
    fetch is a collective)."""

    def __init__(self, shards: ShardedSet, schedule: TileSchedule, payload: Tensor, forms: Forms[Left, Right]) -> None:
        self.shards, self.schedule, self.payload, self.forms = shards, schedule, payload, forms
        self.rank = dist.get_rank(shards.group)
        holders = _holders(schedule, dist.get_world_size(shards.group))
        self.held: dict[int, Right] = {}
        col_blocks, positions = schedule.col_blocks, shards.qg.gallery_positions
        for first, last in self._fetches(col_blocks):  # a collective per fetch: every rank, in the same order
            start = col_blocks[first].start
            fetched = self.fetch(positions[start : col_blocks[last].stop])
            for j in range(first, last + 1):
                if holders[j] == self.rank:
                    self.held[j] = forms.cols(fetched[col_blocks[j].start - start : col_blocks[j].stop - start])

    def fetch(self, positions: Tensor) -> Tensor:
        """The payload rows of the samples at these global positions, from their owners (a collective)."""
        owner, row = self.shards.owner, self.shards.row
        holders = owner[positions]
        parts = gather(self.payload[row[positions[holders == self.rank]]], self.shards.group)
        block = self.payload.new_empty((positions.numel(), *self.payload.shape[1:]))
        block[torch.argsort(holders, stable=True)] = torch.cat(parts)
        return block

    def tiles(self, first_rows_only: bool = False) -> Iterator[Tile[Left, Right]]:
        """This rank's tiles, row blocks outer (``first_rows_only``: those of the first row block)."""
        schedule, positions = self.schedule, self.shards.qg.query_positions
        row_blocks = schedule.row_blocks[:1] if first_rows_only else schedule.row_blocks
        for first, last in self._fetches(row_blocks):
            start = row_blocks[first].start
            fetched = self.fetch(positions[start : row_blocks[last].stop])
            for i in range(first, last + 1):
                rows = row_blocks[i]
                held = self._held_with(rows)
                if not held:  # (no form made for a row block this rank has no tile of)
                    continue
                left = self.forms.rows(fetched[rows.start - start : rows.stop - start])
                for j, right in held:
                    cols = schedule.col_blocks[j]
                    diagonal = schedule.symmetric and i == j
                    yield Tile(rows, cols, left, None if diagonal else right, schedule.mirrored(rows, cols))

    def _held_with(self, rows: slice) -> list[tuple[int, Right]]:
        """The held column blocks that make a tile with the row block ``rows`` (a set against itself has no tile
        below its diagonal)."""
        symmetric, col_blocks = self.schedule.symmetric, self.schedule.col_blocks
        return [(j, c) for j, c in self.held.items() if not (symmetric and col_blocks[j].start < rows.start)]

    def _fetches(self, blocks: list[slice]) -> list[tuple[int, int]]:
        """The blocks fetched together, ``(first, last)``: whole blocks of at most ``FETCH_BYTES`` (at least one
        block). A rank's tiles of one row block may take a tile longer than another rank's, and every fetch makes
        the faster rank wait for the difference: over several row blocks the differences even out."""
        row_bytes = max(1, math.prod(self.payload.shape[1:])) * self.payload.element_size()  # the same on every rank
        groups: list[tuple[int, int]] = []
        for i, rows in enumerate(blocks):
            if groups and (rows.stop - blocks[groups[-1][0]].start) * row_bytes <= FETCH_BYTES:
                groups[-1] = (groups[-1][0], i)
            else:
                groups.append((i, i))
        return groups

    def n_pairs(self) -> int:
        """The ordered pairs of this rank's tiles (its progress bar's total)."""
        return sum(
            (rs.stop - rs.start) * (cs.stop - cs.start) * (2 if self.schedule.mirrored(rs, cs) else 1)
            for rs, cs in self.schedule.tiles()
            if any(cs == self.schedule.col_blocks[j] for j in self.held)
        )
