"""Ranks of relevant items in the *whole* ranking of each query, at the cost of one pass of products.

Used for exact MRR when a query's first relevant item lies beyond the retrieved K, for the full-ranking
average precision (``map``), and for the rank of the last relevant item (``minp``).

The rank of an item ``t`` (1-based, ties ordered by gallery position as everywhere in the package) is one
plus the number of eligible items whose (distance, position) precedes ``t``'s. So:

1. list the relevant items of every query (from the labels; no distances), compute their canonical
   distances pair by pair (the values ``knn`` reports) and sort them per query: these are the query's
   *thresholds*;
2. one pass over the float32 stage-1 keys of every (query, gallery item) block, as the kNN search computes
   them: each eligible item is certainly before or after each threshold, unless its key lies within the
   key's rigorous rounding bound of one, and then it is *ambiguous*. A per-query histogram over the
   thresholds' intervals counts the certain items (a binary search per item, compiled and parallel over
   rows on the CPU; batched ``searchsorted`` elsewhere);
3. the ambiguous items (near ties: under a millionth of the pairs on real data, every exact duplicate) get
   their canonical distance and an exact comparison.

Memory: the thresholds (rows x max n(q), in query chunks) plus one block; never the query x gallery matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._label_pairs import relevant_pairs
from torchmetrics_retrieval.functional._options import RetrievalOptions
from torchmetrics_retrieval.functional._progress import section
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan
from torchmetrics_retrieval.functional._search import plan
from torchmetrics_retrieval.functional._search.certify import canonical_distances, key_tolerance
from torchmetrics_retrieval.functional._search.key_blocks import key_blocks
from torchmetrics_retrieval.functional._search.problem import Problem, make_problem, rounding_terms
from torchmetrics_retrieval.functional._sets import QueryGallery
from torchmetrics_retrieval.functional.relevance import _dense_label_ids

__all__ = ["relevant_ranks"]


class _Thresholds:
    """Sorted thresholds of a chunk of queries: ``distances``/``positions`` ``(R, m)`` (padding: +inf and
    the gallery size), ``filled`` ``(R,)``, and their key brackets ``lower``/``upper`` (float64)."""

    def __init__(
        self,
        problem: Problem,
        rows: Tensor,
        pair_rows: Tensor,
        pair_cols: Tensor,
        m: int,
        symmetric: bool,
        last: bool = False,
        listed: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """``listed``: the pairs' reported distances and their gallery items' canonical squared norms, when the
        pairs were listed elsewhere (a shard of the gallery: ``pair_cols`` are then the items' *virtual*
        positions in it, see ``metrics._sharded.ranks``, and pairs of equal distance come in tie order)."""
        self.symmetric, self.last = symmetric, last
        if listed is None:
            distances = canonical_distances(problem, rows, pair_rows, pair_cols).to(problem.dtype)
            gallery_sq = None
        else:
            distances, gallery_sq = listed
        # per row, by (distance, position): the pairs come with positions increasing in a row
        index, per_row = _per_row_order(pair_rows, distances, rows.numel(), m, last)
        self.distances = _gather_or(distances, index, float("inf"))
        self.positions = _gather_or(pair_cols, index, problem.gallery.shape[0])
        self.filled = per_row.clamp(max=m)
        self.n_listed = per_row  # the row's relevant pairs, thresholds or not
        # the items' norms, which the shard's own gallery may not hold
        threshold_sq = None if gallery_sq is None else _gather_or(gallery_sq.to(torch.float64), index, 0.0)
        self.lower, self.upper = _key_brackets(problem, rows, self.distances, self.positions, symmetric, threshold_sq)

    def count_preceding(self, distances: Tensor, positions: Tensor, pair_rows: Tensor, kernels: Any) -> Tensor:
        """For items ``(distances, positions)`` of the rows ``pair_rows``: the number of the row's thresholds
        that precede or are the item, ``(P,)`` (``kernels``: the compiled kernels, or None)."""
        if kernels is not None:
            found = np.empty(pair_rows.numel(), dtype=np.int64)
            own = (self.distances.to(torch.float64), self.positions, self.filled)
            pairs = (pair_rows, distances.to(torch.float64), positions)
            kernels.count_preceding(*(t.numpy() for t in (*own, *pairs)), found)
            return torch.from_numpy(found)
        counts = torch.empty_like(pair_rows)
        step = max(1, ranks_plan.BUDGET_ENTRIES // max(1, self.distances.shape[1]))
        for s in range(0, pair_rows.numel(), step):
            part = slice(s, s + step)
            t_dist, t_pos = self.distances[pair_rows[part]], self.positions[pair_rows[part]]
            d, p = distances[part, None], positions[part, None]
            counts[part] = ((t_dist < d) | ((t_dist == d) & (t_pos <= p))).sum(dim=1)
        return counts


def _per_row_order(pair_rows: Tensor, distances: Tensor, n_rows: int, m: int, last: bool) -> tuple[Tensor, Tensor]:
    """``(index, per_row)``: per row, the indices of its pairs by distance, ties in the order they are listed
    (the first ``m``; with ``last`` the last one), ``(n_rows, m)`` with -1 past the row's pairs; and the number
    of pairs of each row. One sort of a padded row per row, not of the whole list."""
    device, n_pairs = pair_rows.device, pair_rows.numel()
    in_rows = n_pairs < 2 or bool((pair_rows[1:] >= pair_rows[:-1]).all())
    grouped = None if in_rows else torch.argsort(pair_rows, stable=True)
    if grouped is not None:
        pair_rows, distances = pair_rows[grouped], distances[grouped]
    per_row = torch.bincount(pair_rows, minlength=n_rows)
    starts = torch.cumsum(per_row, 0) - per_row
    width = max(1, int(per_row.max()) if n_rows else 1)
    padded = torch.full((n_rows, width), float("inf"), dtype=distances.dtype, device=device)
    padded[pair_rows, torch.arange(n_pairs, device=device) - starts[pair_rows]] = distances
    order = torch.sort(padded, dim=1, stable=True).indices  # the padding (+inf) last
    if last:
        order = order.gather(1, (per_row - 1).clamp(min=0)[:, None])
    order = order[:, :m]
    listed = torch.arange(order.shape[1], device=device)[None, :] < per_row[:, None].clamp(max=1 if last else m)
    index = (starts[:, None] + order).clamp(max=max(n_pairs - 1, 0))
    if grouped is not None:
        index = grouped[index]
    index = torch.where(listed, index, -1)
    if index.shape[1] < m:  # fewer pairs in every row than thresholds
        index = torch.cat([index, index.new_full((n_rows, m - index.shape[1]), -1)], dim=1)
    return index, per_row


def _gather_or(values: Tensor, index: Tensor, fill: float) -> Tensor:
    """``values[index]``, ``fill`` where the index is -1."""
    if not values.numel():
        return torch.full(index.shape, fill, dtype=values.dtype, device=index.device)
    return torch.where(index >= 0, values[index.clamp(min=0)], fill)


def _key_brackets(
    problem: Problem,
    rows: Tensor,
    distances: Tensor,
    positions: Tensor,
    symmetric: bool,
    threshold_sq: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Stage-1 key bounds ``(lower, upper)`` of the thresholds: an item whose key is certainly below ``lower``
    has a reported distance below the threshold's; certainly above ``upper``, above it.

    ``symmetric``: for the keys of the set against itself (see :func:`_key_blocks`). ``threshold_sq``: the
    canonical squared norms of the thresholds' gallery items (default: looked up at ``positions``).
    The reported distance is the canonical float64 value rounded to the query dtype, so the bracket spans two
    of its ulps either side. The count compares keys within their rounding bound of the bracket; near a
    near-duplicate's threshold the bracket is widened by that bound once more, because the canonical distance
    is there a direct sum, not the key's expansion (see ``keys.distances_from_dots``).
    """
    d = distances.to(torch.float64)
    finfo = torch.finfo(distances.dtype)
    finite = torch.isfinite(d)  # padding (+inf): never before, never ambiguous; kept out of the arithmetic,
    d = torch.where(finite, d, 0.0)  # whose inf - inf would be NaN and spread through the running min below
    margin = d.abs() * (2.0 * finfo.eps) + finfo.tiny
    low, high = d - margin, d + margin
    if problem.distance == "dot":
        lower, upper = low, high
    elif problem.distance == "cosine":
        lower, upper = low - 1.0, high - 1.0
    else:
        q_sq = problem.query_sq64[rows][:, None]
        if problem.distance == "euclidean":
            low, high = low.clamp(min=0.0).square(), high.square()
        if symmetric:  # half the squared distance
            lower, upper = torch.where(low > 0, low / 2, -float("inf")), high / 2
        else:  # the squared distance minus |q|^2
            lower, upper = torch.where(low > 0, low - q_sq, -float("inf")), high - q_sq
        tol = key_tolerance(problem, rows, rounding_terms(problem.query.shape[1]))[:, None]
        if threshold_sq is None:
            threshold_sq = problem.gallery_sq64[positions.clamp(max=problem.gallery.shape[0] - 1)]
        scale = q_sq + threshold_sq
        direct = d.square() < scale * 2.0**-9 if problem.distance == "euclidean" else d < scale * 2.0**-9
        lower, upper = lower - tol * direct, upper + tol * direct
    # monotone in the threshold's rank (the binary search needs it; the widening above may break it): widening
    # a bracket only makes more items ambiguous
    lower, upper = lower.masked_fill(~finite, float("inf")), upper.masked_fill(~finite, float("inf"))
    return lower.flip(1).cummin(dim=1).values.flip(1), upper.cummax(dim=1).values


class _Counter:
    """The per-query histogram over the thresholds' intervals, filled block by block, and the ambiguous items.

    ``add`` takes a block of keys of the rows ``rs`` (of the chunk) against the gallery columns from ``c0``: the
    compiled kernels on the CPU (parallel over rows), batched ``searchsorted`` elsewhere, with the same rule.
    """

    def __init__(
        self,
        problem: Problem,
        rows: Tensor,
        thresholds: _Thresholds,
        tolerance: Tensor,
        label_ids: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        n_rows, m = thresholds.distances.shape
        self.thresholds, self.tolerance = thresholds, tolerance
        self.hist = torch.zeros(n_rows, m + 1, dtype=torch.long, device=rows.device)
        own = problem.exclusions.self_index
        self.own = own[rows] if own is not None else torch.full((n_rows,), -1, dtype=torch.long, device=rows.device)
        self.ambiguous_rows: list[Tensor] = []
        self.ambiguous_cols: list[Tensor] = []
        # decided for the whole problem, not this chunk of its queries (a last, smaller chunk included)
        self.compiled = plan.use_compiled(rows.device, problem.query.shape[0], problem.gallery.shape[0])
        self.skip_relevant = self.compiled and label_ids is not None
        if self.compiled:
            from torchmetrics_retrieval.functional._ranks import kernels as count_kernels
            from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

            kernel_threads()
            self.kernels = count_kernels
            self._spares: dict[torch.dtype, Tensor] = {}
            self.own_np = self.own.numpy()
            n_buckets = max(
                1, min(ranks_plan.LUT_BUCKETS_PER_THRESHOLD * m, ranks_plan.LUT_BYTES // (2 * max(1, n_rows)))
            )
            lut = np.empty((n_rows, n_buckets), dtype=np.int16 if m < 2**15 else np.int32)
            table = (
                thresholds.lower.numpy(), thresholds.upper.numpy(), thresholds.filled.numpy(), tolerance.numpy(),
                lut, np.zeros(n_rows), np.zeros(n_rows),
            )  # fmt: skip
            count_kernels.build_table(*table)
            self.table = table
            # The relevant items are the thresholds: with label ids the kernels skip them and ``counts`` adds
            # their known bins (ids that never match: nothing skipped).
            if label_ids is not None:
                self.query_ids, self.item_ids = label_ids[0][rows].numpy(), label_ids[1].numpy()
            else:
                self.query_ids = np.full(n_rows, -1, dtype=np.int64)
                self.item_ids = np.full(problem.gallery.shape[0], -2, dtype=np.int64)

    def add(self, keys: Tensor, rs: slice, c0: int, mask: Tensor | None, transposed: bool = False) -> None:
        """Count a block of keys of the rows ``rs`` against the gallery columns from ``c0`` (``transposed``: the
        block holds the rows ``rs`` along its columns, the gallery items along its rows)."""
        if self.compiled:
            self._add_compiled(keys, rs, c0, mask, transposed)
            return
        if transposed:
            keys, mask = keys.T, None if mask is None else mask.T
        k = keys.to(torch.float64).contiguous()
        tol = self.tolerance[rs, None]
        first = torch.searchsorted(self.thresholds.upper[rs].contiguous(), k - tol)
        after = torch.searchsorted(self.thresholds.lower[rs].contiguous(), k + tol, right=True)
        eligible = torch.ones_like(first, dtype=torch.bool) if mask is None else mask.clone()
        own = self.own[rs]
        hit = torch.nonzero((own >= c0) & (own < c0 + keys.shape[1])).flatten()
        eligible[hit, own[hit] - c0] = False
        certain = (first == after) & eligible
        self.hist[rs].scatter_add_(1, torch.where(certain, first, self.hist.shape[1] - 1), torch.ones_like(first))
        r, c = torch.nonzero((first < after) & eligible, as_tuple=True)
        self.ambiguous_rows.append(r + rs.start)
        self.ambiguous_cols.append(c + c0)

    def _add_compiled(self, keys: Tensor, rs: slice, c0: int, mask: Tensor | None, transposed: bool) -> None:
        if transposed:  # the row kernel on a transposed copy: reading the columns in place strides through memory
            keys, mask = self._transposed(keys), None if mask is None else self._transposed(mask)
        mask_np = np.ones((1, 1), dtype=np.bool_) if mask is None else mask.numpy()
        table = tuple(a[rs] for a in self.table)
        item_ids = self.item_ids[c0 : c0 + keys.shape[1]]
        keys_np = keys.contiguous().numpy()  # (a block of an unaligned width is a strided view: copied)
        args = (keys_np, c0, self.own_np[rs], mask_np, mask is not None, self.query_ids[rs], item_ids, table)
        n_rows = rs.stop - rs.start
        n_ambiguous = np.zeros(n_rows, dtype=np.int64)
        held = np.empty((n_rows, ranks_plan.AMBIGUOUS_PER_ROW), dtype=np.int64)
        self.kernels.count_rows(*args, self.hist.numpy()[rs], n_ambiguous, held)
        # only the few rows with near ties are read back: a mask over every row's buffer is a serial pass over
        # rows x AMBIGUOUS_PER_ROW entries, a visible share of the call at many threads
        some = np.flatnonzero(n_ambiguous)
        fits = n_ambiguous[some] <= ranks_plan.AMBIGUOUS_PER_ROW
        held_rows, per_row = some[fits], n_ambiguous[some[fits]]
        kept = np.arange(ranks_plan.AMBIGUOUS_PER_ROW)[None, :] < per_row[:, None]
        self.ambiguous_rows.append(torch.from_numpy(np.repeat(held_rows, per_row) + rs.start))
        self.ambiguous_cols.append(torch.from_numpy(held[held_rows][kept]))
        overflow = some[~fits]
        if overflow.size:  # rows with more near ties than the buffer holds: scanned again, all listed
            offsets = np.zeros(overflow.size + 1, dtype=np.int64)
            np.cumsum(n_ambiguous[overflow], out=offsets[1:])
            listed = np.empty(int(offsets[-1]), dtype=np.int64)
            self.kernels.list_ambiguous(*args, overflow, offsets, listed)
            self.ambiguous_rows.append(torch.from_numpy(np.repeat(overflow, n_ambiguous[overflow]) + rs.start))
            self.ambiguous_cols.append(torch.from_numpy(listed))

    def _transposed(self, block: Tensor) -> Tensor:
        """``block.T`` in a buffer kept for the next block: a new one per block left the allocator holding
        hundreds of MB after the count."""
        size = block.numel()
        spare = self._spares.get(block.dtype)
        if spare is None or spare.numel() < size:
            spare = self._spares[block.dtype] = torch.empty(size, dtype=block.dtype)
        return spare[:size].view(block.shape[1], block.shape[0]).copy_(block.T)

    def counts(self, problem: Problem, rows: Tensor) -> Tensor:
        """``(R, m)``: the eligible items before each threshold, once the ambiguous ones are compared exactly."""
        m = self.thresholds.distances.shape[1]
        if self.skip_relevant:  # a threshold follows those before it; the other relevant
            # items follow every threshold, or precede the only one (the last relevant item)
            thresholds = self.thresholds
            self.hist[:, 1:] += torch.arange(m, device=rows.device)[None, :] < thresholds.filled[:, None]
            self.hist[:, 0 if thresholds.last else m] += thresholds.n_listed - thresholds.filled
        if self.ambiguous_rows:
            pair_rows, pair_cols = torch.cat(self.ambiguous_rows), torch.cat(self.ambiguous_cols)
            distances = canonical_distances(problem, rows, pair_rows, pair_cols).to(problem.dtype)
            bins = self.thresholds.count_preceding(
                distances, pair_cols, pair_rows, self.kernels if self.compiled else None
            )
            self.hist.view(-1).index_add_(0, pair_rows * (m + 1) + bins, torch.ones_like(bins))
        return self.hist.cumsum(dim=1)[:, :m]


def _count_before(
    problem: Problem,
    rows: Tensor,
    thresholds: _Thresholds,
    chunk_size: int | None,
    label_ids: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``(R, m)`` int64: eligible gallery items ranked strictly before each threshold of each query.

    ``label_ids``: dense label ids of the queries and the gallery when the thresholds are made from every
    eligible item sharing the query's id (relevance by label equality); the relevant items are then placed
    without a comparison."""
    tolerance = key_tolerance(problem, rows, rounding_terms(problem.query.shape[1]))
    counter = _Counter(problem, rows, thresholds, tolerance, label_ids)
    others = problem.exclusions.take(rows)._replace(self_index=None)  # the rules a block mask serves
    active = thresholds.filled > 0
    for rs, cs, keys, mirrored in key_blocks(problem, rows, chunk_size, thresholds.symmetric):
        mask = others.eligible(rs, cs, (keys.shape[0], keys.shape[1]), rows.device)
        if bool(active[rs].any()):
            counter.add(keys, rs, cs.start, mask)
        if mirrored and bool(active[cs].any()):  # the same block serves its columns' queries
            counter.add(keys, cs, rs.start, mask, transposed=True)
    return counter.counts(problem, rows)


def relevant_ranks(
    qg: QueryGallery,
    n_relevant: Tensor,
    options: RetrievalOptions,
    max_relevant: int | None = None,
    last: bool = False,
) -> Tensor:
    """1-based ranks of the first ``max_relevant`` relevant items of every query of ``qg`` in its full ranking
    (``last``: of its last relevant item only, as one column).

    Ties in distance are ordered by gallery position, as everywhere in the package.

    Returns:
        ``(Q, m)`` int64 ranks in increasing order, 0 past the query's n(q) relevant items, where
        ``m = min(max_relevant, max n(q))`` (1 with ``last``).
    """
    n_query = qg.query.shape[0]
    device = qg.query.device
    n_max = int(n_relevant.max()) if n_query else 0
    if n_max == 0:
        return torch.zeros(n_query, 0, dtype=torch.long, device=device)
    m = 1 if last else n_max if max_relevant is None else min(max_relevant, n_max)
    problem = make_problem(qg.query, qg.gallery, options.distance, qg.exclusions(), qg.same_set)
    label_ids = _dense_label_ids(qg.query_labels, qg.gallery_labels) if options.label_comparison_fn is None else None
    ranks = torch.zeros(n_query, m, dtype=torch.long, device=device)
    step = max(1, ranks_plan.BUDGET_ENTRIES // (n_max + 1))
    with section("full ranking", n_query * qg.gallery.shape[0]):
        for rows in torch.arange(n_query, device=device).split(step):
            pair_rows, pair_cols = relevant_pairs(qg, problem, rows, options.label_comparison_fn)
            symmetric = problem.symmetric and rows.numel() == n_query  # the whole set against itself at once
            thresholds = _Thresholds(problem, rows, pair_rows, pair_cols, m, symmetric, last)
            before = _count_before(problem, rows, thresholds, options.chunk_size, label_ids)
            listed = torch.arange(m, device=device)[None, :] < thresholds.filled[:, None]
            ranks[rows] = torch.where(listed, before + 1, 0)
    return ranks
