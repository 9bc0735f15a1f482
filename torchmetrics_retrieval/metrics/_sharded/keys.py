"""The stage-1 key tiles of a sharded set: one process's ``key_blocks`` of the whole set, each tile computed by one
rank from the same float32 operands, so each key is one process's, bit for bit.

The tiles are ``key_blocks``' tiles of the global set (one ``TileSchedule``: same sides, same global row and column
ranges), shared out by ``tiles.ShardedTiles``. Each rank computes its tiles with the same product
(``SymmetricKeys`` / ``addmm_keys``, IEEE float32) of the same float32 stage rows (``stage_rows`` of the canonical
squared norms: row by row, so the owner of a row makes the same row), given a BLAS that repeats a product of the
same operands. The passes over every pair (``pairs``) read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._progress import advance
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.functional._search.key_blocks import KeyBlock
from torchmetrics_retrieval.functional._search.keys import Float64Rows, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.stream_topk import BlockMemory
from torchmetrics_retrieval.functional._search.torch_stage import symmetric_left_rows, symmetric_right_rows
from torchmetrics_retrieval.metrics._sharded.gather import gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, placeholder_problem
from torchmetrics_retrieval.metrics._sharded.tiles import Forms, ShardedTiles, Tile

__all__ = ["ShardedKeys"]


class _RowBlock(NamedTuple):
    """A row block's operands: the left one of its products, and (symmetric) the right one of its diagonal tile."""

    left: Tensor
    right: Tensor | None


class ShardedKeys:
    """This rank's key tiles of the global set of ``shards`` (see the module docstring), and ``problem``: the
    global problem (placeholder rows, every canonical squared norm by global position). Every rank must make it
    and read its blocks together (each fetch of rows is a collective)."""

    def __init__(self, shards: ShardedSet, distance: str, chunk_size: int | None) -> None:
        qg, local, owner, row, group = shards
        local64 = Float64Rows(local)  # read block by block: no float64 copy of the shard
        sq64 = self_dots(local64)
        stage, stage_sq = stage_rows(local64, sq64, distance)
        self.l2 = stage_sq is not None
        # the float32 stage row and squared norm of every local row, sent together
        norms = stage_sq if stage_sq is not None else stage.new_zeros(len(stage))
        stage_payload = torch.cat([stage, norms[:, None]], 1)
        del stage  # (its copy in the payload is the one kept)
        parts = gather(sq64, group)
        first = torch.tensor([0, *(part.numel() for part in parts)], device=local.device).cumsum(0)[:-1]
        self.problem = placeholder_problem(qg, distance, torch.cat(parts)[first[owner] + row])
        self.symmetric = self.problem.symmetric
        schedule = TileSchedule.of(qg.query.shape[0], qg.gallery.shape[0], chunk_size, self.symmetric)
        self.dim = stage_payload.shape[1] - 1
        self.memory = BlockMemory(aligned=True)  # every tile's keys in one buffer, laid out as on one process
        forms = Forms(self._row_block, self._symmetric_rows if self.symmetric else self._gallery_block)
        self.tiles: ShardedTiles[_RowBlock, Any] = ShardedTiles(shards, schedule, stage_payload, forms)
        self.n_pairs = self.tiles.n_pairs()

    def key_blocks(self, first_rows_only: bool = False) -> Iterator[KeyBlock]:
        """This rank's blocks of keys (``first_rows_only``: of the first row block), at least one (empty when the
        rank has no tile): each block's keys are overwritten by the next block's."""
        any_tile = False
        for tile in self.tiles.tiles(first_rows_only):
            any_tile = True
            yield KeyBlock(tile.rows, tile.cols, self._keys(tile), tile.mirrored)
            advance(tile.n_pairs)
        if not any_tile:
            empty = slice(0, 0)
            yield KeyBlock(empty, empty, torch.zeros((0, 0)), False)

    def _symmetric_rows(self, payload: Tensor) -> Tensor:
        """A block of the symmetric set as the right operand of ``SymmetricKeys``' product (the same tensor)."""
        dim = self.dim
        return symmetric_right_rows(payload[:, :dim], payload[:, dim] / 2 if self.l2 else None)

    def _gallery_block(self, payload: Tensor) -> tuple[Tensor, Tensor]:
        """A gallery block as ``addmm_keys`` reads it: its contiguous rows and the keys' bias (``|g|^2`` or 0)."""
        rows = payload[:, : self.dim].contiguous()
        return rows, payload[:, self.dim].clone() if self.l2 else torch.zeros_like(rows[:, 0])

    def _row_block(self, payload: Tensor) -> _RowBlock:
        """A row block as the products read it: the left operand, and (symmetric) its right one for the tile on
        the diagonal."""
        if not self.symmetric:
            return _RowBlock(payload[:, : self.dim].contiguous(), None)
        right = self._symmetric_rows(payload)
        return _RowBlock(symmetric_left_rows(right, self.dim), right)

    def _keys(self, tile: Tile[_RowBlock, Any]) -> Tensor:
        """The keys of a tile by ``key_blocks``' product: the same operands, made once per block."""
        left = tile.left.left
        with ieee_float32_matmul():
            if self.symmetric:
                right = tile.left.right if tile.right is None else tile.right
                assert right is not None  # (a symmetric row block keeps its right operand)
                return torch.mm(left, right.T, out=self.memory(left.shape[0], right.shape[0], left))
            assert tile.right is not None  # (a one-sided schedule has no diagonal tile)
            rows, bias = tile.right
            out = self.memory(left.shape[0], rows.shape[0], left)
            return torch.addmm(bias[None], left, rows.T, alpha=-2.0 if self.l2 else -1.0, out=out)
