"""FNMR@FMR, EER and minDCF in sharded mode: every rank keeps its embeddings, the values are one process's.

On one process the two passes over every pair (``functional._pairs.quantiles``) read each pair's float32
distance from the stage-1 key blocks of ``functional._pairs.passes`` (``key_blocks``): a set against itself in symmetric
tiles (``|x_i - x_j|^2 / 2`` or ``-<x_i, x_j>``, one key for both ordered pairs), otherwise tiles of query rows
against gallery columns (``|g|^2 - 2<q,g>`` plus ``|q|^2``, or ``-<q,g>``). These distances are not the
canonical ones of the kNN search: the key of a pair depends on the tile's formula, so a shard that paired its
rows its own way (say one-sided, its queries against another rank's gallery) would read other float32
values, hence other thresholds and counts. So the ranks compute exactly the tiles of one process:

* the tiles are one process's key tiles, each computed by one rank (``keys.ShardedKeys``): every key is one
  process's, bit for bit (given a BLAS that repeats a product of the same operands, which one process's second
  pass already needs: it recomputes every tile);
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
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_retrieval.functional._pairs.passes import PairPasses
from torchmetrics_retrieval.functional._pairs.quantiles import PairBuckets, merge_counted, statistics
from torchmetrics_retrieval.functional._pairs.rates import Counted, RateRequest
from torchmetrics_retrieval.functional._search.key_blocks import KeyBlock
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn
from torchmetrics_retrieval.functional.verification import PairRequest, _bounds_of_norms, statistics_keys
from torchmetrics_retrieval.metrics._sharded import auc as sharded_auc
from torchmetrics_retrieval.metrics._sharded.gather import all_reduce, gather
from torchmetrics_retrieval.metrics._sharded.global_set import ShardedSet, global_problem
from torchmetrics_retrieval.metrics._sharded.keys import ShardedKeys

__all__ = ["ShardedPairs", "sharded_pair_compute", "sharded_pair_metrics"]


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
        self.group, self.shards = shards.group, shards
        self.keys = ShardedKeys(shards, distance, chunk_size)
        super().__init__(shards.qg, distance, label_comparison_fn, chunk_size, self.keys.problem)
        self.n_pairs = self.keys.n_pairs

    def _key_blocks(self, first_rows_only: bool = False) -> Iterator[KeyBlock]:
        return self.keys.key_blocks(first_rows_only)

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
