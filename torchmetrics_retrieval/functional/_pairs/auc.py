"""Exact ROC AUC over every ordered (query, gallery item) pair, streamed: the area under TAR against FAR, i.e. the
share of (positive pair, negative pair) couples whose positive distance is the smaller, ties counting one half —
scikit-learn's ``roc_auc_score(is_positive, -distance)`` over all pairs, without listing them.

The positive pairs are few and listed from the labels, with their canonical distances (the values ``knn``
reports), and sorted. One pass over float64 blocks of inner products then places every negative pair among them.
A block's distance is not the canonical one (another summation order), but both lie within a rigorous bound of
the exact value; where the bound's two ends round to the same float32 number that number *is* the canonical
float32 distance, so ties between positives and negatives are counted exactly. The rare pairs where the ends
differ are computed canonically, one by one. (With float64 embeddings the canonical distances are float64 and
every pair takes that slower way.) The float32 search keys of the other pair metrics cannot serve here: their
bound spans hundreds of float32 steps, and with hundreds of thousands of positive distances spread over the same
range almost every negative would fall within one.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._label_pairs import relevant_pairs
from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._precision import ieee_sqrt
from torchmetrics_retrieval.functional._progress import advance, section
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.blocks import TileSchedule
from torchmetrics_retrieval.functional._search.certify import canonical_distances
from torchmetrics_retrieval.functional._search.compiled import DISTANCE_CODES
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem
from torchmetrics_retrieval.functional._search.stream_topk import BlockMemory
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn, _dense_label_ids, _label_match_compute

__all__ = ["ProductTile", "nan_without_pairs", "place_negatives", "positive_distances", "roc_auc_of_pairs"]


class _Positives:
    """The sorted canonical distances of the positive pairs, with the lookup table of the compiled kernel."""

    def __init__(self, values: Tensor) -> None:
        self.values = torch.sort(values.cpu()).values
        n = self.values.numel()
        self.n_buckets = max(1, min(n, pairs_plan.LUT_ENTRIES))
        first, last = float(self.values[0]), float(self.values[-1])
        self.first = first
        self.inv_width = self.n_buckets / (last - first) if last > first else 0.0
        buckets = np.minimum((self.values.double().numpy() - first) * self.inv_width, self.n_buckets - 1.0)
        # lut[b]: the first positive whose bucket (computed as the kernel computes it) is b or later; lut[n_buckets]
        # closes the last bucket
        edges = np.arange(self.n_buckets + 1)
        self.lut = np.searchsorted(buckets.astype(np.int64), edges, side="left").astype(np.int32)

    def table(self) -> tuple[Any, ...]:
        return (self.values.numpy(), self.lut, self.first, self.inv_width, float(self.n_buckets))

    def place(self, distances: Tensor) -> tuple[int, int]:
        """``(below, equal)`` summed over ``distances`` (a few values: searchsorted)."""
        values = self.values.to(distances.device)
        left = torch.searchsorted(values, distances)
        right = torch.searchsorted(values, distances, right=True)
        return int(left.sum()), int((right - left).sum())


def positive_distances(qg: QueryGallery, problem: Problem, fn: LabelComparisonFn | None) -> Tensor:
    """The canonical distances of every eligible positive pair (ordered pairs, in no useful order)."""
    rows = torch.arange(qg.query.shape[0], device=qg.query.device)
    pair_rows, pair_cols = relevant_pairs(qg, problem, rows, fn)
    return canonical_distances(problem, rows, pair_rows, pair_cols).to(problem.dtype)


class ProductTile(NamedTuple):
    """A tile of float64 inner products: the pairs ``rows`` x ``cols`` of the whole problem (labels, rules, self
    index), whose rows sit at ``at_rows`` and ``at_cols`` of ``problem`` (the whole problem on one process; a
    problem of the tile's rows alone on a rank of a sharded evaluation). ``mirrored``: it also stands for the pairs
    (column, row)."""

    rows: slice
    cols: slice
    dots: Tensor
    mirrored: bool
    problem: Problem
    at_rows: slice
    at_cols: slice


def _tiles(problem: Problem, chunk_size: int | None) -> Iterator[ProductTile]:
    """Every tile of the problem, each valid until the next."""
    n_rows, n_cols = problem.query64.shape[0], problem.gallery64.shape[0]
    memory = BlockMemory()  # a fresh product per tile would fault in its pages anew
    schedule = TileSchedule.of(n_rows, n_cols, chunk_size, problem.symmetric, bytes_per_pair=9)
    for rs, cs in schedule.tiles():
        mirrored = schedule.mirrored(rs, cs)
        left, right = problem.query64[rs], problem.gallery64[cs]
        dots = torch.mm(left, right.T, out=memory(left.shape[0], right.shape[0], left))
        yield ProductTile(rs, cs, dots, mirrored, problem, rs, cs)
        advance((rs.stop - rs.start) * (cs.stop - cs.start) * (2 if mirrored else 1))


def nan_without_pairs(n_positive: int, n_negative: int, device: torch.device, stacklevel: int = 5) -> Tensor | None:
    """NaN (float64, 0-dim) with a warning when there is no positive or no negative pair, else None."""
    if n_positive and n_negative:
        return None
    reason = "no positive pair (no query has a relevant item)" if n_positive == 0 else "no negative pair"
    warnings.warn(f"roc_auc is NaN: there is {reason}.", UserWarning, stacklevel=stacklevel)
    return torch.full((), math.nan, dtype=torch.float64, device=device)


def roc_auc_of_pairs(
    qg: QueryGallery,
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
    positives: Tensor | None = None,
) -> Tensor:
    """``roc_auc`` (float64, 0-dim) of a checked problem; NaN with a warning without positive or negative pairs.
    ``positives``: :func:`positive_distances` of the problem, when already listed."""
    device = qg.query.device
    problem = make_problem(qg.query, qg.gallery, distance, qg.exclusions(), qg.same_set)
    n_query, n_gallery = qg.query.shape[0], qg.gallery.shape[0]
    if positives is None:
        positives = positive_distances(qg, problem, label_comparison_fn)
    n_positive = positives.numel()
    n_negative = int(qg.exclusions().count_eligible(n_query, n_gallery, device).sum()) - n_positive
    undefined = nan_without_pairs(n_positive, n_negative, device)
    if undefined is not None:
        return undefined
    with section("pairs, ROC AUC", n_query * n_gallery):
        below, equal = place_negatives(qg, problem, _Positives(positives), label_comparison_fn, chunk_size)
    area = (below + 0.5 * equal) / (n_positive * n_negative)  # Python ints: exact up to the one division
    return torch.tensor(area, dtype=torch.float64, device=device)


def place_negatives(
    qg: QueryGallery,
    problem: Problem,
    positives: _Positives,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
    tiles: Iterable[ProductTile] | None = None,
) -> tuple[int, int]:
    """``(below, equal)``: over every eligible negative pair of ``qg`` (``problem`` its problem), the positive
    distances ``positives`` strictly below and equal to its canonical distance; exact whatever the tiles.
    ``tiles``: the tiles to read (a part of the pairs, each read once by one caller), by default every tile."""
    device = qg.query.device
    n_query, n_gallery = qg.query.shape[0], qg.gallery.shape[0]
    ids = None if label_comparison_fn is not None else _dense_label_ids(qg.query_labels, qg.gallery_labels)
    compiled = ids is not None and problem.dtype == torch.float32 and plan.use_compiled(device, n_query, n_gallery)
    own = problem.exclusions.self_index
    own = own if own is not None else torch.full((n_query,), -1, dtype=torch.long, device=device)
    others = problem.exclusions._replace(self_index=None)
    below = equal = 0
    for tile in _tiles(problem, chunk_size) if tiles is None else tiles:
        mask = others.eligible(tile.rows, tile.cols, (tile.dots.shape[0], tile.dots.shape[1]), device)
        if compiled:
            assert ids is not None
            found = _compiled_block(tile, mask, own, ids, positives)
        else:
            found = _torch_block(qg, tile, mask, own, ids, label_comparison_fn, positives)
        weight = 2 if tile.mirrored else 1
        below, equal = below + weight * found[0], equal + weight * found[1]
    return below, equal


def _compiled_block(
    tile: ProductTile,
    mask: Tensor | None,
    own: Tensor,
    ids: tuple[Tensor, Tensor],
    positives: _Positives,
) -> tuple[int, int]:
    from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

    kernels = importlib.import_module("torchmetrics_retrieval.functional._pairs.auc_kernels")
    kernel_threads()
    problem, rs, cs, dots = tile.problem, tile.rows, tile.cols, tile.dots
    q_sq, g_sq = problem.query_sq64[tile.at_rows], problem.gallery_sq64[tile.at_cols]
    args = (
        dots.numpy(), q_sq.numpy(), g_sq.numpy(), ieee_sqrt(q_sq).numpy(), ieee_sqrt(g_sq).numpy(),
        DISTANCE_CODES[problem.distance], 1.01 * problem.query64.shape[1] * 2.0**-53, cs.start, own[rs].numpy(),
        np.ones((1, dots.shape[1]), dtype=np.bool_) if mask is None else mask.numpy(),
        ids[0][rs].numpy(), ids[1][cs].numpy(),
    )  # fmt: skip
    out = np.zeros((dots.shape[0], 3), dtype=np.int64)
    kernels.count_block(*args, positives.table(), out)
    below, equal, undecided = (int(v) for v in out.sum(axis=0))
    if undecided:  # listed again, only in the rows that have some
        per_row = out[:, 2]
        which = np.nonzero(per_row)[0]
        offsets = np.zeros(which.size + 1, dtype=np.int64)
        np.cumsum(per_row[which], out=offsets[1:])
        cols = np.empty(undecided, dtype=np.int64)
        kernels.list_undecided(*args, which, offsets, cols)
        rows = torch.from_numpy(np.repeat(which, per_row[which]))
        exact = _canonical(tile, rows, torch.from_numpy(cols))
        more = positives.place(exact)
        below, equal = below + more[0], equal + more[1]
    return below, equal


def _torch_block(
    qg: QueryGallery,
    tile: ProductTile,
    mask: Tensor | None,
    own: Tensor,
    ids: tuple[Tensor, Tensor] | None,
    label_comparison_fn: LabelComparisonFn | None,
    positives: _Positives,
) -> tuple[int, int]:
    """Any device, dtype or label rule: every negative pair of the block gets its canonical distance."""
    rs, cs = tile.rows, tile.cols
    if ids is not None:
        negative = ids[0][rs, None] != ids[1][None, cs]
    else:
        negative = ~_label_match_compute(qg.query_labels[rs], qg.gallery_labels[cs], label_comparison_fn)
    if mask is not None:
        negative &= mask
    hit = torch.nonzero((own[rs] >= cs.start) & (own[rs] < cs.stop)).flatten()
    negative[hit, own[rs][hit] - cs.start] = False
    rows, cols = torch.nonzero(negative, as_tuple=True)
    return positives.place(_canonical(tile, rows, cols))


def _canonical(tile: ProductTile, rows: Tensor, cols: Tensor) -> Tensor:
    """The canonical distances of the tile's pairs ``(rows[i], cols[i])`` (positions within the tile), in the
    embeddings' dtype: computed pair by pair, so the same whichever problem holds the rows."""
    problem = tile.problem
    at_rows = torch.arange(tile.at_rows.start, tile.at_rows.stop, device=rows.device)
    return canonical_distances(problem, at_rows, rows, cols + tile.at_cols.start).to(problem.dtype)
