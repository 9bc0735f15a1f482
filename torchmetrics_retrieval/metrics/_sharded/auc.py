"""ROC AUC in sharded mode: every rank keeps its embeddings, the value is one process's, bit for bit.

On one process (``functional._pairs.auc``) the positive pairs are listed from the labels with their canonical
distances and sorted; one pass over float64 blocks of inner products then places every eligible negative pair
among them, counting the positives strictly below (``below``) and equal to (``equal``) its distance, and the
area is ``(below + equal / 2) / (n_pos * n_neg)``. Each negative's decision is exact and independent of the
block that computes it: where a block's rigorous bound is ambiguous the pair takes its canonical distance,
computed pair by pair, the same on any rank and in any company. So any partition of the ordered pairs gives the
same integer counts. Every part is planned as part of the whole problem (``ShardedSet.whole``), so every part
takes the compiled kernels where one process would.

1. *positives* (:func:`positive_pairs`): in the visiting rounds (``rounds``) every rank's next block of its own
   queries visits every rank, which lists the positive pairs between the visitors and its gallery shard with their
   canonical distances (``_pairs.auc.positive_distances``); they are all-gathered, so every rank holds the multiset
   of every positive pair's distance, whatever the order of the parts. ``n_pos`` is their number, ``n_neg`` the
   eligible pairs of the global labels and rules minus ``n_pos``, as on one process.
2. *negatives*: each rank places the negatives of its tiles of one process's schedule (``tiles.ShardedTiles``:
   symmetric tiles for a set against itself) among all positives, through ``_pairs.auc.place_negatives`` with the
   tiles injected; ``below`` and ``equal`` are summed with one int64 ``all_reduce``.

The counts are integers, so their sum is exact, and the final division is the one-process Python expression on
the same integers. Without positive or negative pairs every rank returns NaN with the one-process warning (the
counts are global, so every rank takes that way, and no rank reads the tiles).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._pairs.auc import (
    ProductTile,
    _Positives,
    nan_without_pairs,
    place_negatives,
    positive_distances,
)
from torchmetrics_retrieval.functional._progress import advance, section
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.functional._search.keys import Float64Rows, self_dots
from torchmetrics_retrieval.functional._search.problem import GalleryCache, Problem, make_problem
from torchmetrics_retrieval.functional._search.stream_topk import BlockMemory
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, placeholder_problem, restrict_gallery
from torchmetrics_retrieval.metrics._sharded.rounds import visiting_rounds
from torchmetrics_retrieval.metrics._sharded.search import QUERY_BLOCK
from torchmetrics_retrieval.metrics._sharded.tiles import Forms, ShardedTiles

__all__ = ["sharded_roc_auc"]

#: A block of rows (float64, or as stored for a held column block) and their canonical squared norms.
Float64Block = tuple[Tensor, Tensor]


class _Rounds:
    """The sub-problems of this rank: every rank's query blocks, in the visiting rounds, against this rank's gallery
    shard (``same_set=False``: each ordered pair computed once, by the rank holding its gallery item)."""

    def __init__(self, shards: ShardedSet, distance: str) -> None:
        qg, local, owner, row, group = shards
        self.qg, self.local, self.row, self.distance, self.group = qg, local, row, distance, group
        rank = dist.get_rank(group)
        columns = torch.nonzero(owner[qg.gallery_positions] == rank).flatten()  # global gallery positions
        self.shard = restrict_gallery(qg, columns, local[row[qg.gallery_positions[columns]]])
        self.queries = torch.nonzero(owner[qg.query_positions] == rank).flatten()  # this rank's query rows
        self.cache = GalleryCache(keep_rows=False)  # the shard's canonical norms, computed once for every round

    def __iter__(self) -> Iterator[tuple[QueryGallery, Problem] | None]:
        """``(sub-problem, its problem)`` per round; ``None`` when this rank has nothing to do in the round."""
        for visit in visiting_rounds(self.queries.numel(), QUERY_BLOCK, self.group, self.local.device):
            mine = self.queries[visit.mine]
            visiting_rows = visit.join(mine)
            visiting = visit.join(self.local[self.row[self.qg.query_positions[mine]]])
            if not (visiting.shape[0] and self.shard.gallery.shape[0]):
                yield None
                continue
            sub = self.shard.take(visiting_rows)._replace(query=visiting)
            # float64 rows read on demand: the positives' canonical distances need only their own rows
            problem = make_problem(
                sub.query, sub.gallery, self.distance, sub.exclusions(), False, lazy64=True, gallery_cache=self.cache
            )
            yield sub, problem


def _row_block(payload: Tensor) -> Float64Block:
    """A row block in float64 with its canonical squared norms, computed row by row as one process does."""
    rows = payload.to(torch.float64)
    return rows, self_dots(rows)


def _held_block(payload: Tensor) -> Float64Block:
    """A held column block as fetched (made float64 tile by tile: a float64 copy of every held block would double
    the rank's share of the rows), with its canonical squared norms."""
    return payload.clone(), self_dots(Float64Rows(payload))


def _product_tiles(tiles: ShardedTiles[Float64Block, Float64Block], problem: Problem) -> Iterator[ProductTile]:
    """This rank's tiles as float64 products, each with a problem of its own rows."""
    memory = BlockMemory()  # a fresh product per tile would fault in its pages anew
    for tile in tiles.tiles():
        left, left_sq = tile.left
        right, right_sq = tile.left if tile.right is None else (tile.right[0].to(torch.float64), tile.right[1])
        own = problem._replace(query64=left, gallery64=right, query_sq64=left_sq, gallery_sq64=right_sq)
        at_rows, at_cols = slice(0, left.shape[0]), slice(0, right.shape[0])
        dots = torch.mm(left, right.T, out=memory(left.shape[0], right.shape[0], left))
        yield ProductTile(tile.rows, tile.cols, dots, tile.mirrored, own, at_rows, at_cols)
        advance(tile.n_pairs)


def positive_pairs(shards: ShardedSet, distance: str, label_comparison_fn: LabelComparisonFn | None) -> Tensor:
    """Every eligible positive pair's canonical distance over the sharded set, on every rank (in no useful order):
    listed in the visiting rounds by the rank holding the pair's gallery item. Every rank must call it."""
    found = [positive_distances(*part, label_comparison_fn) for part in _Rounds(shards, distance) if part is not None]
    mine = torch.cat(found) if found else shards.local.new_zeros((0,))
    return torch.cat(gather(mine, shards.group))


def sharded_roc_auc(
    shards: ShardedSet,
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
    positives: Tensor | None = None,
) -> Tensor:
    """``roc_auc`` (float64, 0-dim) of a sharded set: on every rank the value of
    ``functional._pairs.auc.roc_auc_of_pairs`` over the global set. Every rank must call it. ``positives``:
    :func:`positive_pairs` of the set, when already listed (on every rank alike)."""
    qg, local, _, _, group = shards
    device = local.device
    every_positive = positive_pairs(shards, distance, label_comparison_fn) if positives is None else positives
    n_positive = every_positive.numel()
    n_eligible = int(qg.exclusions().count_eligible(qg.query.shape[0], qg.gallery.shape[0], device).sum())
    n_negative = n_eligible - n_positive
    undefined = nan_without_pairs(n_positive, n_negative, device)
    if undefined is not None:
        return undefined
    problem = placeholder_problem(qg, distance)
    schedule = TileSchedule.of(qg.query.shape[0], qg.gallery.shape[0], chunk_size, problem.symmetric, 9)
    tiles = ShardedTiles(shards, schedule, local, Forms(_row_block, _held_block))
    with section("pairs, ROC AUC", tiles.n_pairs()):
        placed = place_negatives(
            qg, problem, _Positives(every_positive), label_comparison_fn, chunk_size, _product_tiles(tiles, problem)
        )
    counts = all_reduce(torch.tensor(placed, dtype=torch.int64, device=device), group)
    below, equal = (int(v) for v in counts)
    area = (below + 0.5 * equal) / (n_positive * n_negative)  # Python ints: one process's expression
    return torch.tensor(area, dtype=torch.float64, device=device)
