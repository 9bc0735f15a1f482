r"""Verification metrics on pairs: FNMR@FMR, TAR@FAR and the DET curve, exact and streaming.

Pairs (see docs/definitions.md): for every query ``q`` and every gallery item ``g`` of its gallery ``G(q)``
(``q`` itself, items of its sequence and of other search groups removed), the ordered pair ``(q, g)``
is *positive* when the labels match and *negative* otherwise; the pairs of a query without any
relevant item are therefore all negatives. With :math:`v` the negative and :math:`u` the positive
distances,

.. math::
    T_f = Q_v(f) \quad\text{(numpy's default linear interpolation)}, \qquad
    \mathrm{FNMR@FMR}{=}f = \frac{\#\{i : u_i \ge T_f\}}{\#u}, \qquad \mathrm{TAR@FAR}{=}f = 1 - \mathrm{FNMR@FMR}{=}f.

The value is exact, and no pair is materialised: the distance matrix is streamed block by block twice.

1. Count the positive and negative pairs and histogram their distances on shared bucket edges. The
   bucket function is monotone, so the cumulative counts give the bucket holding each order
   statistic the quantiles need (the k-th and (k+1)-th smallest negative distance).
2. Collect the distinct distances (with multiplicities) of the negatives in those buckets and of the
   positives in the buckets between them, select the exact order statistics, interpolate the
   threshold, and count the positives at or above it exactly (buckets above are counted whole).

Memory is one distance block plus the histograms plus the collected distinct values, which the float
resolution keeps small; N = 60k leave-one-out (3.6e9 pairs) runs in a few hundred MB.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_retrieval.functional._checks import check_choice, check_fractions, describe
from torchmetrics_retrieval.functional._sets import PairedIds, split_query_gallery
from torchmetrics_retrieval.functional.relevance import LabelComparisonFn, label_match
from torchmetrics_retrieval.functional.search import DISTANCES, Distance, DistanceBlock, distance_blocks

__all__ = ["DEFAULT_FMR_GRID", "det_curve", "fnmr_at_fmr", "fnmr_at_fmr_from_distances"]

#: Number of histogram buckets of the first pass.
N_BUCKETS = 2**16
#: Collected distinct values are merged (de-duplicated) whenever this many are pending.
MERGE_EVERY = 2**22
#: FMR values of :func:`det_curve` when no grid is given: 51 points, log-spaced from 1e-5 to 1.
DEFAULT_FMR_GRID: tuple[float, ...] = tuple(10.0 ** (-5 + i / 10) for i in range(51))


class _PairBlock(NamedTuple):
    """Distances of some pairs, which of them are positive, and which exist (None: all)."""

    distances: Tensor
    positive: Tensor
    eligible: Tensor | None


PairSource = Callable[[], Iterator[_PairBlock]]


class _Buckets(NamedTuple):
    """Monotone bucket function ``floor((d - low) * scale)`` clamped to ``[0, N_BUCKETS)``.

    Only exactly rounded operations (subtract, multiply, clamp, truncate), so the bucket of a value does
    not depend on where it sits in a tensor.
    """

    low: float
    scale: float

    @classmethod
    def spanning(cls, low: float, high: float) -> _Buckets:
        width = high - low
        return cls(low, N_BUCKETS / width if width > 0 and math.isfinite(width) else 1.0)

    def ids(self, distances: Tensor) -> Tensor:
        """int32 bucket ids (truncation is the floor once clamped at 0)."""
        return torch.sub(distances, self.low).mul_(self.scale).clamp_(0, N_BUCKETS - 1).to(torch.int32)

    def pair_ids(self, block: _PairBlock) -> Tensor:
        """Flat int32 ids in ``[0, 2 N_BUCKETS]``: negatives' buckets, positives' + N_BUCKETS, 2 N_BUCKETS for
        the pairs that do not exist."""
        ids = self.ids(block.distances).add_(block.positive, alpha=N_BUCKETS)
        if block.eligible is not None:
            ids.masked_fill_(~block.eligible, 2 * N_BUCKETS)
        return ids.flatten()


class _Curve(NamedTuple):
    """Per requested FMR value: the threshold and the FNMR (float64), NaN when undefined."""

    thresholds: Tensor
    fnmr: Tensor


class _Counts(NamedTuple):
    """Distinct values (sorted) with multiplicities."""

    values: Tensor
    counts: Tensor


# ----------------------------------------------------------------------------------------------------------------------
# pass 1: histograms
# ----------------------------------------------------------------------------------------------------------------------


def _histograms(source: PairSource, buckets: _Buckets) -> tuple[Tensor, Tensor]:
    """``(negative, positive)`` histograms, ``(N_BUCKETS,)`` int64 each."""
    total: Tensor | None = None
    for block in source():
        ids = buckets.pair_ids(block)
        if total is None:
            total = torch.zeros(2 * N_BUCKETS + 1, dtype=torch.int64, device=ids.device)
        if ids.numel() >= N_BUCKETS:  # bincount is fast on big blocks, but costs O(N_BUCKETS) per call
            total += torch.bincount(ids, minlength=2 * N_BUCKETS + 1)
        else:
            total.index_add_(0, ids, torch.ones((), dtype=torch.int64, device=ids.device).expand(ids.numel()))
    if total is None:
        raise RuntimeError("the pair source yielded no block")
    return total[:N_BUCKETS], total[N_BUCKETS : 2 * N_BUCKETS]


# ----------------------------------------------------------------------------------------------------------------------
# pass 2: exact values inside the wanted buckets
# ----------------------------------------------------------------------------------------------------------------------


def _merge(parts: list[_Counts]) -> _Counts:
    values = torch.cat([p.values for p in parts])
    counts = torch.cat([p.counts for p in parts])
    distinct, inverse = torch.unique(values, return_inverse=True)
    return _Counts(distinct, torch.zeros_like(distinct, dtype=torch.int64).index_add_(0, inverse, counts))


class _Collector:
    """Accumulates distinct values with multiplicities, merging as it goes."""

    def __init__(self, like: Tensor) -> None:
        empty = _Counts(like.new_empty(0), torch.zeros(0, dtype=torch.int64, device=like.device))
        self.parts: list[_Counts] = [empty]
        self.pending = 0

    def add(self, values: Tensor) -> None:
        distinct, counts = torch.unique(values, return_counts=True)
        self.parts.append(_Counts(distinct, counts))
        self.pending += distinct.numel()
        if self.pending > MERGE_EVERY:
            self.parts, self.pending = [_merge(self.parts)], 0

    def result(self) -> _Counts:
        return _merge(self.parts)


def _collect(
    source: PairSource, buckets: _Buckets, negative_wanted: Tensor, positive_wanted: Tensor
) -> tuple[_Counts, _Counts]:
    """Distinct negative (positive) distances in the wanted buckets, with multiplicities."""
    no = torch.zeros(1, dtype=torch.bool, device=negative_wanted.device)
    wanted_ids = torch.cat([negative_wanted, positive_wanted, no])  # indexed by ``pair_ids``
    negatives: _Collector | None = None
    positives: _Collector | None = None
    for block in source():
        wanted = wanted_ids[buckets.pair_ids(block)]
        distances = block.distances.flatten()[wanted]
        positive = block.positive.flatten()[wanted]
        if negatives is None or positives is None:
            negatives, positives = _Collector(distances), _Collector(distances)
        negatives.add(distances[~positive])
        positives.add(distances[positive])
    if negatives is None or positives is None:
        raise RuntimeError("the pair source yielded no block")
    return negatives.result(), positives.result()


# ----------------------------------------------------------------------------------------------------------------------
# exact quantiles and rates
# ----------------------------------------------------------------------------------------------------------------------


def _quantile_ranks(n: int, fractions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """numpy's "linear" method: ranks (0-based) of the two order statistics and the interpolation weight."""
    virtual = (n - 1) * fractions  # numpy's virtual index of the "linear" method
    below = virtual.floor().clamp(0, n - 1)
    gamma = (virtual - below).clamp(0, 1)
    return below.long(), (below + 1).clamp(max=n - 1).long(), gamma


def _lerp(a: Tensor, b: Tensor, gamma: Tensor) -> Tensor:
    """numpy's interpolation ``a + (b - a) * gamma`` (from ``b`` when ``gamma >= 0.5``) in float64, kept in [a, b]."""
    diff = b - a
    value = torch.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return torch.minimum(torch.maximum(value, a), b)


def _order_statistics(ranks: Tensor, collected: _Counts, histogram: Tensor, buckets: _Buckets) -> Tensor:
    """The values of the given global ranks, from the collected content of the buckets holding them."""
    values, counts = collected
    ids = buckets.ids(values)
    running = counts.cumsum(0)
    segment_start = torch.searchsorted(ids, ids)  # first collected value of the same bucket
    within = running - (running[segment_start] - counts[segment_start])  # inclusive count inside the bucket
    before_bucket = histogram.cumsum(0) - histogram
    ends = _segment_ends(ids)
    if not torch.equal(within[ends], histogram[ids[ends]]):  # every wanted bucket was collected whole
        raise RuntimeError("distances differ between the two passes; they must be deterministic")
    inclusive = before_bucket[ids] + within
    return values[torch.searchsorted(inclusive, ranks, right=True)].to(torch.float64)


def _segment_ends(ids: Tensor) -> Tensor:
    """Index of the last element of each run of equal ``ids`` (sorted)."""
    last = torch.ones_like(ids, dtype=torch.bool)
    last[:-1] = ids[1:] != ids[:-1]
    return torch.nonzero(last).flatten()


def _bucket_of_rank(histogram: Tensor, ranks: Tensor) -> Tensor:
    return torch.searchsorted(histogram.cumsum(0), ranks, right=True)


def _wanted_buckets(first: Tensor, last: Tensor, device: torch.device) -> Tensor:
    """Bool ``(N_BUCKETS,)``: True in every range ``[first[i], last[i]]``."""
    marks = torch.zeros(N_BUCKETS + 1, dtype=torch.int64, device=device)
    marks.index_add_(0, first, torch.ones_like(first))
    marks.index_add_(0, last + 1, -torch.ones_like(last))
    return marks.cumsum(0)[:N_BUCKETS] > 0


def _nan_curve(n_values: int, reason: str, device: torch.device) -> _Curve:
    warnings.warn(f"FNMR@FMR is NaN: {reason}.", UserWarning, stacklevel=4)
    nan = torch.full((n_values,), math.nan, dtype=torch.float64, device=device)
    return _Curve(nan, nan.clone())


def _curve(source: PairSource, buckets: _Buckets, fractions: tuple[float, ...], device: torch.device) -> _Curve:
    """Thresholds and FNMR at the given FMR values, exact, from two passes over ``source``."""
    negative_hist, positive_hist = _histograms(source, buckets)
    n_negative, n_positive = int(negative_hist.sum()), int(positive_hist.sum())
    if n_negative == 0:
        return _nan_curve(len(fractions), "there is no negative pair (every pair's labels match)", device)
    if n_positive == 0:
        return _nan_curve(len(fractions), "there is no positive pair (no query has a relevant item)", device)
    f = torch.tensor(fractions, dtype=torch.float64, device=device)
    low_rank, high_rank, gamma = _quantile_ranks(n_negative, f)
    low_bucket = _bucket_of_rank(negative_hist, low_rank)
    high_bucket = _bucket_of_rank(negative_hist, high_rank)
    negative_wanted = torch.zeros(N_BUCKETS, dtype=torch.bool, device=device)
    negative_wanted[low_bucket] = True
    negative_wanted[high_bucket] = True
    positive_wanted = _wanted_buckets(low_bucket, high_bucket, device)
    negatives, positives = _collect(source, buckets, negative_wanted, positive_wanted)

    low = _order_statistics(low_rank, negatives, negative_hist, buckets)
    high = _order_statistics(high_rank, negatives, negative_hist, buckets)
    thresholds = _lerp(low, high, gamma)
    # Positives above the high order statistic's bucket are >= the threshold; below the low one, < it.
    above = n_positive - positive_hist.cumsum(0)[high_bucket]
    positive_ids = buckets.ids(positives.values)
    at_or_above = (positives.values.to(torch.float64)[None, :] >= thresholds[:, None]) & (
        positive_ids[None, :] <= high_bucket[:, None]
    )
    n_at_or_above = above + (at_or_above * positives.counts[None, :]).sum(dim=1)
    return _Curve(thresholds, n_at_or_above.to(torch.float64) / n_positive)


# ----------------------------------------------------------------------------------------------------------------------
# sources of pairs
# ----------------------------------------------------------------------------------------------------------------------


def _check_distances(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a 1-D torch.Tensor of distances, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(value)}.")
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must have a real dtype, got {describe(value)}.")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"`{name}` must be finite, got NaN or inf in {describe(value)}.")
    return value


def _given_distances(positive: Tensor, negative: Tensor) -> tuple[PairSource, _Buckets]:
    dtype = torch.promote_types(torch.promote_types(positive.dtype, negative.dtype), torch.float32)
    if not dtype.is_floating_point:
        dtype = torch.float64
    pos, neg = positive.to(dtype), negative.to(dtype)
    both = torch.cat([pos, neg])
    buckets = _Buckets.spanning(float(both.min()), float(both.max())) if both.numel() else _Buckets(0.0, 1.0)

    def source() -> Iterator[_PairBlock]:
        yield _PairBlock(pos, torch.ones_like(pos, dtype=torch.bool), None)
        yield _PairBlock(neg, torch.zeros_like(neg, dtype=torch.bool), None)

    return source, buckets


def _distance_bounds(query: Tensor, gallery: Tensor, distance: str) -> tuple[float, float]:
    """Bounds of every distance by the Cauchy-Schwarz inequality (rounding may cross them: buckets clamp)."""
    if distance == "cosine":
        return 0.0, 2.0
    q_max = float(query.to(torch.float64).norm(dim=1).max())
    g_max = float(gallery.to(torch.float64).norm(dim=1).max())
    if distance == "euclidean":
        return 0.0, q_max + g_max
    if distance == "sqeuclidean":
        return 0.0, (q_max + g_max) ** 2
    return -q_max * g_max, q_max * g_max


def _retrieval_pairs(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None,
    gallery_labels: Tensor | None,
    *,
    is_query: Tensor | None,
    is_gallery: Tensor | None,
    sequence_ids: PairedIds | None,
    search_groups: PairedIds | None,
    distance: str,
    label_comparison_fn: LabelComparisonFn | None,
    chunk_size: int | None,
) -> tuple[PairSource, _Buckets]:
    check_choice("distance", distance, DISTANCES)
    qg = split_query_gallery(
        query,
        query_labels,
        gallery,
        gallery_labels,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
    )
    self_index = qg.self_index if bool((qg.self_index >= 0).any()) else None

    def blocks() -> Iterator[DistanceBlock]:
        return distance_blocks(
            qg.query,
            qg.gallery,
            distance=distance,  # type: ignore[arg-type]
            self_index=self_index,
            sequence_ids=qg.sequence_ids,
            search_groups=qg.search_groups,
            chunk_size=chunk_size,
        )

    blocks()  # validates the exclusions and the chunk size now; the blocks are computed lazily

    def source() -> Iterator[_PairBlock]:
        for block in blocks():
            positive = label_match(
                qg.query_labels[block.query_slice], qg.gallery_labels[block.gallery_slice], label_comparison_fn
            )
            yield _PairBlock(block.distances, positive, block.eligible)

    return source, _Buckets.spanning(*_distance_bounds(qg.query, qg.gallery, distance))


# ----------------------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------------------


def fnmr_at_fmr_from_distances(
    pos_dist: Tensor, neg_dist: Tensor, fmr_vals: float | Iterable[float] = (0.1,)
) -> Tensor:
    r"""FNMR at given FMR values from the distances of positive and negative pairs.

    :math:`T_f` is the ``f``-quantile of ``neg_dist`` (numpy's linear interpolation) and the value is the
    fraction of ``pos_dist`` that is ``>= T_f``. Same algorithm as :func:`fnmr_at_fmr`.

    Args:
        pos_dist: ``(P,)`` distances of the positive pairs (any real dtype, finite).
        neg_dist: ``(M,)`` distances of the negative pairs.
        fmr_vals: FMR values in [0, 1].

    Returns:
        ``(len(fmr_vals),)`` float32 tensor; NaN with a warning when ``P = 0`` or ``M = 0``.

    Example:
        >>> pos = torch.tensor([0, 0, 1, 1, 2, 2, 5, 5, 9, 9])
        >>> neg = torch.tensor([3, 3, 4, 4, 6, 6, 7, 7, 8, 8])
        >>> fnmr_at_fmr_from_distances(pos, neg, fmr_vals=(0.1, 0.5))
        tensor([0.4000, 0.2000])
    """
    fractions = check_fractions("fmr_vals", fmr_vals)
    pos = _check_distances("pos_dist", pos_dist)
    neg = _check_distances("neg_dist", neg_dist).to(pos.device)
    source, buckets = _given_distances(pos, neg)
    return _curve(source, buckets, fractions, pos.device).fnmr.to(torch.float32)


def fnmr_at_fmr(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    fmr_vals: float | Iterable[float] = (0.1,),
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    distance: Distance = "euclidean",
    label_comparison_fn: LabelComparisonFn | None = None,
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    r"""FNMR@FMR and TAR@FAR over all (query, gallery) pairs, exact, without materialising the pairs.

    See the module docstring for the definition of the pairs and of the values. The query and gallery
    sets are described as in :func:`~torchmetrics_retrieval.functional.retrieval.retrieval_metrics`:
    with ``gallery=None`` the first pair of arguments is the whole set and ``is_query`` /
    ``is_gallery`` (missing: all True) select the queries and gallery items, a sample never being
    paired with itself; otherwise ``(query, query_labels)`` and ``(gallery, gallery_labels)`` are two
    separate sets, and ``sequence_ids`` / ``search_groups`` are ``(query_side, gallery_side)`` pairs.

    Args:
        query: ``(Q, D)`` embeddings (or the whole set when ``gallery`` is None).
        query_labels: ``(Q,)`` or ``(Q, L)`` labels, any dtype.
        gallery: ``(G, D)`` embeddings or None.
        gallery_labels: ``(G,)`` or ``(G, L)`` labels, with ``gallery``.
        fmr_vals: FMR values in [0, 1].
        is_query: ``(N,)`` bool, which samples are queries (``gallery=None`` only).
        is_gallery: ``(N,)`` bool, which samples are gallery items (``gallery=None`` only).
        sequence_ids: pairs of the same sequence are left out.
        search_groups: only pairs of the same group are formed.
        distance: ``"euclidean"``, ``"sqeuclidean"``, ``"cosine"`` or ``"dot"``.
        label_comparison_fn: custom label match, ``fn(query_labels[:, None], gallery_labels[None, :])``.
        chunk_size: largest side of a block of the distance matrix.

    Returns:
        ``{"fnmr@fmr/{f}": tensor, ..., "tar@far/{f}": tensor, ...}``: 0-dim float32 tensors, ``f``
        printed as Python prints it. NaN with a warning when there is no positive or no negative pair.

    Raises:
        TypeError, ValueError: malformed inputs, an FMR value outside [0, 1].

    Example:
        >>> # leave-one-out: positive distances (1, 1, 4, 4), negative (2, 2, 3, 3, 6, 6, 7, 7)
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
        >>> fnmr_at_fmr(x, torch.tensor([0, 0, 1, 1]), fmr_vals=(0.1, 0.5))
        {'fnmr@fmr/0.1': tensor(0.5000), 'fnmr@fmr/0.5': tensor(0.),
         'tar@far/0.1': tensor(0.5000), 'tar@far/0.5': tensor(1.)}
    """
    fractions = check_fractions("fmr_vals", fmr_vals)
    source, buckets = _retrieval_pairs(
        query,
        query_labels,
        gallery,
        gallery_labels,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
        distance=distance,
        label_comparison_fn=label_comparison_fn,
        chunk_size=chunk_size,
    )
    fnmr = _curve(source, buckets, fractions, query.device).fnmr.to(torch.float32)
    out = {f"fnmr@fmr/{f}": fnmr[i] for i, f in enumerate(fractions)}
    out.update({f"tar@far/{f}": 1 - fnmr[i] for i, f in enumerate(fractions)})
    return out


def det_curve(
    query: Tensor,
    query_labels: Tensor,
    gallery: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    fmr_grid: Iterable[float] = DEFAULT_FMR_GRID,
    is_query: Tensor | None = None,
    is_gallery: Tensor | None = None,
    sequence_ids: PairedIds | None = None,
    search_groups: PairedIds | None = None,
    distance: Distance = "euclidean",
    label_comparison_fn: LabelComparisonFn | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Points of the DET curve (FNMR against FMR) on a grid of FMR values, for plotting.

    Same inputs and pairs as :func:`fnmr_at_fmr`; one point per grid value ``f``: the threshold
    :math:`T_f` (the ``f``-quantile of the negative distances) and FNMR at it. TAR against FAR (the ROC
    curve) is ``(fmr, 1 - fnmr)``.

    Returns:
        ``(fmr, fnmr, thresholds)``, three ``(len(fmr_grid),)`` float64 tensors, ``fmr`` the grid.

    Example:
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
        >>> fmr, fnmr, thresholds = det_curve(x, torch.tensor([0, 0, 1, 1]), fmr_grid=(0.0, 0.5, 1.0))
        >>> fnmr.tolist(), thresholds.tolist()
        ([0.5, 0.0, 0.0], [2.0, 4.5, 7.0])
    """
    fractions = check_fractions("fmr_grid", fmr_grid)
    source, buckets = _retrieval_pairs(
        query,
        query_labels,
        gallery,
        gallery_labels,
        is_query=is_query,
        is_gallery=is_gallery,
        sequence_ids=sequence_ids,
        search_groups=search_groups,
        distance=distance,
        label_comparison_fn=label_comparison_fn,
        chunk_size=chunk_size,
    )
    curve = _curve(source, buckets, fractions, query.device)
    fmr = torch.tensor(fractions, dtype=torch.float64, device=query.device)
    return fmr, curve.fnmr, curve.thresholds
