r"""Exact quantiles of streamed pair distances, and counts against them: the engine of FNMR@FMR and the DET curve.

A *pair source* yields blocks of pair distances with their positive/negative flags; nothing else is held.
The values are exact, and no pair is materialised: the source is streamed twice.

1. Count the positive and negative pairs and histogram their distances on shared bucket edges. The
   bucket function is monotone, so the cumulative counts give the bucket holding each order
   statistic the quantiles need (the k-th and (k+1)-th smallest negative distance).
2. Collect the distinct distances (with multiplicities) of the negatives in those buckets and of the
   positives in the buckets between them, select the exact order statistics, interpolate the
   threshold (numpy's default linear rule), and count the positives at or above it exactly (buckets
   above are counted whole).

Memory is one block plus the histograms plus the collected distinct values, which the float resolution
keeps small. When a sample of the pairs foresees the buckets of step 2, the first pass also counts their
distinct distances (``windows``), and the second pass runs only if the foresight missed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._pairs.rates import Counted, RateRequest, rates, wanted_buckets
from torchmetrics_retrieval.functional._pairs.windows import Windows, likely_buckets
from torchmetrics_retrieval.functional._progress import section

__all__ = [
    "Curve",
    "PairBlock",
    "PairBuckets",
    "PairSource",
    "PassTotals",
    "Statistics",
    "curve",
    "merge_counted",
    "statistics",
]


class PairBlock(NamedTuple):
    """Distances of some pairs, which of them are positive, and which exist (None: all)."""

    distances: Tensor
    positive: Tensor
    eligible: Tensor | None


PairSource = Callable[[], Iterator[PairBlock]]


class PassTotals(Protocol):
    """How the results of the two passes over a source that holds a part of the pairs become those of every
    pair (``metrics._sharded.pairs``: summed and merged over the processes)."""

    def histograms(self, negative: Tensor, positive: Tensor) -> tuple[Tensor, Tensor]: ...

    def collected(self, negatives: Counted, positives: Counted) -> tuple[Counted, Counted]: ...

    def counters(self, fine: np.ndarray) -> np.ndarray: ...


class PairBuckets(NamedTuple):
    """Monotone bucket function ``floor((d - low) * scale)`` clamped to ``[0, pairs_plan.N_BUCKETS)``.

    Only exactly rounded operations (subtract, multiply, clamp, truncate), so the bucket of a value does
    not depend on where it sits in a tensor.
    """

    low: float
    scale: float

    @classmethod
    def spanning(cls, low: float, high: float) -> PairBuckets:
        width = high - low
        return cls(low, pairs_plan.N_BUCKETS / width if width > 0 and math.isfinite(width) else 1.0)

    def ids(self, distances: Tensor) -> Tensor:
        """int32 bucket ids (truncation is the floor once clamped at 0), computed in float64 (as the compiled
        pair kernels do: the same exactly rounded operations give the same bucket)."""
        offset = torch.sub(distances.to(torch.float64), self.low)
        return offset.mul_(self.scale).clamp_(0, pairs_plan.N_BUCKETS - 1).to(torch.int32)

    def pair_ids(self, block: PairBlock) -> Tensor:
        """Flat int32 ids in ``[0, 2 N_BUCKETS]``: negatives' buckets, positives' + ``N_BUCKETS``, ``2 N_BUCKETS``
        for the pairs that do not exist."""
        ids = self.ids(block.distances).add_(block.positive, alpha=pairs_plan.N_BUCKETS)
        if block.eligible is not None:
            ids.masked_fill_(~block.eligible, 2 * pairs_plan.N_BUCKETS)
        return ids.flatten()


class Curve(NamedTuple):
    """Per requested FMR value: the threshold and the FNMR (float64), NaN when undefined."""

    thresholds: Tensor
    fnmr: Tensor


_Counts = Counted  # distinct values (sorted) with multiplicities


# ----------------------------------------------------------------------------------------------------------------------
# pass 1: histograms
# ----------------------------------------------------------------------------------------------------------------------


def _histograms(source: PairSource, buckets: PairBuckets, windows: Windows | None) -> tuple[Tensor, Tensor]:
    """``(negative, positive)`` histograms, ``(pairs_plan.N_BUCKETS,)`` int64 each (from the source's own compiled pass
    when it offers one, see ``passes``, which also counts the values inside ``windows``)."""
    offered = getattr(source, "histograms", None)
    counted = offered(buckets, windows) if offered is not None else None
    if counted is not None:
        return counted
    total: Tensor | None = None
    for block in source():
        ids = buckets.pair_ids(block)
        if total is None:
            total = torch.zeros(2 * pairs_plan.N_BUCKETS + 1, dtype=torch.int64, device=ids.device)
        if (
            ids.numel() >= pairs_plan.N_BUCKETS
        ):  # bincount is fast on big blocks, but costs O(pairs_plan.N_BUCKETS) per call
            total += torch.bincount(ids, minlength=2 * pairs_plan.N_BUCKETS + 1)
        else:
            total.index_add_(0, ids, torch.ones((), dtype=torch.int64, device=ids.device).expand(ids.numel()))
    if total is None:
        raise RuntimeError("the pair source yielded no block")
    return total[: pairs_plan.N_BUCKETS], total[pairs_plan.N_BUCKETS : 2 * pairs_plan.N_BUCKETS]


# ----------------------------------------------------------------------------------------------------------------------
# pass 2: exact values inside the wanted buckets
# ----------------------------------------------------------------------------------------------------------------------


def merge_counted(parts: list[_Counts]) -> _Counts:
    """Distinct values (sorted) with multiplicities of several such lists (of disjoint or overlapping pairs)."""
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
        if self.pending > pairs_plan.MERGE_EVERY:
            self.parts, self.pending = [merge_counted(self.parts)], 0

    def result(self) -> _Counts:
        return merge_counted(self.parts)


def _wanted_pairs(source: PairSource, buckets: PairBuckets, wanted_ids: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """``(distances, positive)`` of the pairs of every block whose (bucket, sign) is wanted."""
    for block in source():
        wanted = wanted_ids[buckets.pair_ids(block)]
        yield block.distances.flatten()[wanted], block.positive.flatten()[wanted]


def _collect(
    source: PairSource, buckets: PairBuckets, negative_wanted: Tensor, positive_wanted: Tensor
) -> tuple[_Counts, _Counts]:
    """Distinct negative (positive) distances in the wanted buckets, with multiplicities."""
    no = torch.zeros(1, dtype=torch.bool, device=negative_wanted.device)
    wanted_ids = torch.cat([negative_wanted, positive_wanted, no])  # indexed by ``pair_ids``
    negatives: _Collector | None = None
    positives: _Collector | None = None
    offered = getattr(source, "wanted", None)
    listed = offered(buckets, wanted_ids) if offered is not None else None
    for distances, positive in listed if listed is not None else _wanted_pairs(source, buckets, wanted_ids):
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


def _order_statistics(ranks: Tensor, collected: _Counts, histogram: Tensor, buckets: PairBuckets) -> Tensor:
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
    """Bool ``(pairs_plan.N_BUCKETS,)``: True in every range ``[first[i], last[i]]``."""
    marks = torch.zeros(pairs_plan.N_BUCKETS + 1, dtype=torch.int64, device=device)
    marks.index_add_(0, first, torch.ones_like(first))
    marks.index_add_(0, last + 1, -torch.ones_like(last))
    return marks.cumsum(0)[: pairs_plan.N_BUCKETS] > 0


def _nan_curve(n_values: int, reason: str, device: torch.device) -> Curve:
    warnings.warn(f"FNMR@FMR is NaN: {reason}.", UserWarning, stacklevel=4)
    nan = torch.full((n_values,), math.nan, dtype=torch.float64, device=device)
    return Curve(nan, nan.clone())


def curve(source: PairSource, buckets: PairBuckets, fractions: tuple[float, ...], device: torch.device) -> Curve:
    """Thresholds and FNMR at the given FMR values, exact, from two passes over ``source``."""
    return statistics(source, buckets, fractions, None, device).curve


def _windows(
    source: PairSource, buckets: PairBuckets, fractions: tuple[float, ...], request: RateRequest | None
) -> Windows | None:
    """The values pass 1 should count exactly (``windows``), from a sample of the source's pairs; None
    when the source offers no sample or the sample foresees too little."""
    sample = getattr(source, "sample", None)
    found = sample(buckets) if sample is not None else None
    likely = None if found is None else likely_buckets(found, fractions, request)
    if found is None or likely is None:
        return None
    # the pass keeps a row of counters per thread (at most torch's threads)
    return Windows.around(likely, buckets.low, buckets.scale, found.n_pairs, torch.get_num_threads())


class Statistics(NamedTuple):
    """The curve at the requested FMR values, the rates (``eer``, ``min_dcf/{p}``) and each rate's operating
    point ``(FMR, FNMR)``."""

    curve: Curve
    rates: dict[str, Tensor]
    points: dict[str, Tensor]


def statistics(
    source: PairSource,
    buckets: PairBuckets,
    fractions: tuple[float, ...],
    request: RateRequest | None,
    device: torch.device,
    totals: PassTotals | None = None,
) -> Statistics:
    """The curve at ``fractions`` and the rates of ``request`` (EER, minDCF; see ``rates``), exact, from
    two passes over ``source`` shared by all of them, or one when the windows foresee the second's buckets
    (``totals``: the source holds a part of the pairs, and each pass's result, the windows' counts included,
    becomes that of every pair through it)."""
    total = getattr(source, "n_pairs", None)
    windows = _windows(source, buckets, fractions, request)
    with section("pairs, histograms", total):
        negative_hist, positive_hist = _histograms(source, buckets, windows)
    if totals is not None:
        negative_hist, positive_hist = totals.histograms(negative_hist, positive_hist)
    n_negative, n_positive = int(negative_hist.sum()), int(positive_hist.sum())
    reason = "there is no negative pair (every pair's labels match)" if n_negative == 0 else None
    if n_positive == 0:
        reason = "there is no positive pair (no query has a relevant item)"
    if reason is not None:
        nan = torch.full((), math.nan, dtype=torch.float64, device=device)
        names = [] if request is None else ["eer"] * request.eer + [f"min_dcf/{p}" for p in request.p_targets]
        nan_points = {name: torch.full((2,), math.nan, dtype=torch.float64, device=device) for name in names}
        return Statistics(_nan_curve(len(fractions), reason, device), dict.fromkeys(names, nan), nan_points)
    f = torch.tensor(fractions, dtype=torch.float64, device=device)
    low_rank, high_rank, gamma = _quantile_ranks(n_negative, f)
    low_bucket = _bucket_of_rank(negative_hist, low_rank)
    high_bucket = _bucket_of_rank(negative_hist, high_rank)
    negative_wanted = torch.zeros(pairs_plan.N_BUCKETS, dtype=torch.bool, device=device)
    negative_wanted[low_bucket] = True
    negative_wanted[high_bucket] = True
    positive_wanted = _wanted_buckets(low_bucket, high_bucket, device)
    if request is not None:  # both signs of the buckets the rates read (more pairs do not change the curve)
        whole = wanted_buckets(negative_hist, positive_hist, request)
        negative_wanted, positive_wanted = negative_wanted | whole, positive_wanted | whole
    needed = negative_wanted | positive_wanted
    if windows is not None and totals is not None:  # every part's counts of the tracked values
        windows.fine = totals.counters(windows.fine.sum(axis=0, keepdims=True, dtype=np.int64))
    early = None if windows is None else windows.read(buckets.ids, negative_hist, positive_hist, needed)
    if early is not None:  # every wanted bucket was counted by value in pass 1
        negatives, positives = early
    else:
        with section("pairs, exact values", total):
            negatives, positives = _collect(source, buckets, negative_wanted, positive_wanted)
        if totals is not None:
            negatives, positives = totals.collected(negatives, positives)
    found, points = (
        ({}, {}) if request is None else rates(negative_hist, positive_hist, negatives, positives, buckets.ids, request)
    )
    if not fractions:
        return Statistics(Curve(f, f.clone()), found, points)

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
    return Statistics(Curve(thresholds, n_at_or_above.to(torch.float64) / n_positive), found, points)
