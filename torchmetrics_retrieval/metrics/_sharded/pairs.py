"""FNMR@FMR, EER and minDCF in sharded mode: every rank keeps its embeddings, the values are one process's.

On one process the two passes over every pair (``functional._pairs.quantiles``) read each pair's float32
distance from the stage-1 key blocks of ``functional._pairs.passes`` (``key_blocks``): a set against itself in symmetric
tiles (``|x_i - x_j|^2 / 2`` or ``-<x_i, x_j>``, one key for both ordered pairs), otherwise tiles of query rows
against gallery columns (``|g|^2 - 2<q,g>`` plus ``|q|^2``, or ``-<q,g>``). These distances are not the
canonical ones of the kNN search: the key of a pair depends on the tile's formula, so a shard that paired its
rows its own way (say one-sided, its queries against another rank's gallery) would read other float32
values, hence other thresholds and counts. So the ranks compute exactly the tiles of one process:

* the tiles are ``key_blocks``' tiles of the global set (one ``TileSchedule``: same sides, same global row and
  column ranges), shared out by ``tiles.ShardedTiles``: each rank computes its tiles with the same product
  (``SymmetricKeys`` / ``addmm_keys``, IEEE float32) of the same float32 stage rows (``stage_rows`` of the
  canonical squared norms: row by row, so the owner of a row makes the same row). Every key is one process's,
  bit for bit, given a BLAS that repeats a product of the same operands (which one process's second pass
  already needs: it recomputes every tile);
* every other per-pair input is global and small (labels, exclusion rules, self index, and the key form's
  offsets, the gathered squared norms), so ``PairPasses`` itself turns a tile into distances, signs,
  eligibility and buckets, with the tile's global ranges, by the same kernels;
* the bucket edges come from the largest norms (all-reduced, each norm computed row by row as one process
  does); the histograms are summed over the ranks (integers: exact), so every rank picks the same wanted
  buckets; the distinct distances collected there, with their multiplicities, are gathered and merged (a
  union of multisets, whatever the order). From these the values are one process's code on the same numbers;
* the sample that foresees the exact values (``PairPasses.sample``) is every rank's tiles of the first row block,
  summed; the windows' counts of the tracked values are summed before they are read, so one pass suffices
  where it does on one process.

Each tile is computed by one rank, so each ordered pair is counted once. A rank holds its column blocks (about
``1/P`` of the gallery, whole blocks), one row block and one tile of keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._pairs.passes import PairPasses
from torchmetrics_retrieval.functional._pairs.quantiles import PairBuckets, merge_counted, statistics
from torchmetrics_retrieval.functional._pairs.rates import Counted, RateRequest
from torchmetrics_retrieval.functional._precision import ieee_float32_matmul
from torchmetrics_retrieval.functional._progress import advance
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.functional._search.key_blocks import KeyBlock
from torchmetrics_retrieval.functional._search.keys import Float64Rows, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.stream_topk import BlockMemory
from torchmetrics_retrieval.functional._search.torch_stage import symmetric_left_rows, symmetric_right_rows
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.verification import PairRequest, _bounds_of_norms, statistics_keys
from torchmetrics_retrieval.metrics._sharded import auc as sharded_auc
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, global_problem, placeholder_problem
from torchmetrics_retrieval.metrics._sharded.tiles import Forms, ShardedTiles, Tile

__all__ = ["ShardedPairs", "sharded_pair_compute", "sharded_pair_metrics"]


class _RowBlock(NamedTuple):
    """A row block's operands: the left one of its products, and (symmetric) the right one of its diagonal tile."""

    left: Tensor
    right: Tensor | None


class ShardedPairs(PairPasses):
    """The pairs of a sharded set: this rank's tiles (see the module docstring). Every rank must make it and run
    every pass together (the passes all-gather the row blocks)."""

    def __init__(
        self,
        shards: ShardedSet,
        distance: str,
        label_comparison_fn: LabelComparisonFn | None,
        chunk_size: int | None,
    ) -> None:
        qg, local, owner, row, group = shards
        self.group, self.shards = group, shards
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
        every_sq = torch.cat(parts)[first[owner] + row]  # by global position
        super().__init__(qg, distance, label_comparison_fn, chunk_size, placeholder_problem(qg, distance, every_sq))
        schedule = TileSchedule.of(qg.query.shape[0], qg.gallery.shape[0], chunk_size, self.symmetric)
        self.dim = stage_payload.shape[1] - 1
        self.memory = BlockMemory(aligned=True)  # every tile's keys in one buffer, laid out as on one process
        forms = Forms(self._row_block, self._symmetric_rows if self.symmetric else self._gallery_block)
        self.sharded_tiles: ShardedTiles[_RowBlock, Any] = ShardedTiles(shards, schedule, stage_payload, forms)
        self.n_pairs = self.sharded_tiles.n_pairs()

    @property
    def symmetric(self) -> bool:
        return self.problem.symmetric

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

    def _key_blocks(self, first_rows_only: bool = False) -> Iterator[KeyBlock]:
        any_tile = False
        for tile in self.sharded_tiles.tiles(first_rows_only):
            any_tile = True
            keys = self._keys(tile)
            yield KeyBlock(tile.rows, tile.cols, keys, tile.mirrored)
            advance(tile.n_pairs)
        if not any_tile:  # the passes read at least one block
            empty = slice(0, 0)
            yield KeyBlock(empty, empty, torch.zeros((0, 0)), False)

    def _sample_blocks(self) -> Iterator[KeyBlock]:
        return self._key_blocks(first_rows_only=True)

    def _sample_total(self, hist: Tensor) -> Tensor:
        return all_reduce(hist, self.group)

    def _positive_distances(self) -> Tensor:
        return sharded_auc.positive_pairs(self.shards, self.problem.distance, self.label_comparison_fn)


class _Totals:
    """The passes' results of every rank's pairs: histograms summed, collected distances merged."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def histograms(self, negative: Tensor, positive: Tensor) -> tuple[Tensor, Tensor]:
        both = torch.stack([negative, positive])
        all_reduce(both, self.group)
        return both[0], both[1]

    def collected(self, negatives: Counted, positives: Counted) -> tuple[Counted, Counted]:
        return self._merged(negatives), self._merged(positives)

    def counters(self, fine: np.ndarray) -> np.ndarray:
        return all_reduce(torch.from_numpy(fine), self.group).numpy()

    def _merged(self, counted: Counted) -> Counted:
        values, counts = gather(counted.values, self.group), gather(counted.counts, self.group)
        return merge_counted([Counted(v, c) for v, c in zip(values, counts, strict=True)])


def _buckets(shards: ShardedSet, distance: str) -> PairBuckets:
    """``_distance_bounds``' buckets of the global set: the largest query and gallery norms, all-reduced."""
    if distance == "cosine":
        return PairBuckets.spanning(*_bounds_of_norms(0.0, 0.0, distance))
    qg, local, owner, row, group = shards
    rank = dist.get_rank(group)
    norms = local.to(torch.float64).norm(dim=1)  # row by row, as one process's norms of its rows

    def largest(positions: Tensor) -> Tensor:
        mine = norms[row[positions[owner[positions] == rank]]]
        return mine.max() if mine.numel() else norms.new_tensor(-torch.inf)

    found = torch.stack([largest(qg.query_positions), largest(qg.gallery_positions)])
    all_reduce(found, group, dist.ReduceOp.MAX)
    return PairBuckets.spanning(*_bounds_of_norms(float(found[0]), float(found[1]), distance))


def sharded_pair_metrics(shards: ShardedSet, request: PairRequest) -> dict[str, Tensor]:
    """``fnmr@fmr/{f}``, ``tar@far/{f}``, ``eer``, ``min_dcf/{p}`` of a sharded set (as ``ShardedPairs``) and,
    with ``roc_auc``, ``roc_auc`` (``auc``): on every rank the values of
    ``functional.verification.pair_metrics`` over the global set."""
    fmr_vals, rates, distance, label_comparison_fn, chunk_size, roc_auc = request
    out: dict[str, Tensor] = {}
    if request.needs_statistics:
        source = ShardedPairs(shards, distance, label_comparison_fn, chunk_size)
        device = shards.local.device
        found = statistics(source, _buckets(shards, distance), fmr_vals, rates, device, _Totals(shards.group))
        out.update(statistics_keys(found, fmr_vals))
    if roc_auc:
        listed = source.listed_positives if request.needs_statistics else None  # the sample's, as on one process
        auc = sharded_auc.sharded_roc_auc(shards, distance, label_comparison_fn, chunk_size, listed)
        out["roc_auc"] = auc.to(torch.float32)
    return out


def sharded_pair_compute(
    metric: Any,
    group: Any,
    fmr_vals: tuple[float, ...],
    request: RateRequest,
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
    roc_auc: bool = False,
) -> dict[str, Tensor]:
    """The pair metrics of a sample accumulator whose ranks keep their samples (``FNMRAtFMR``); with ``roc_auc``
    also ``roc_auc`` (``auc``)."""
    shards, _ = global_problem(metric, group, distance)
    with shards.whole():
        pairs = PairRequest(fmr_vals, request, distance, label_comparison_fn, chunk_size, roc_auc)
        return sharded_pair_metrics(shards, pairs)
