"""The second pass of the pair metrics, done inside the first when its buckets can be foreseen.

FNMR@FMR, EER and minDCF read every pair twice (``quantiles``): a histogram of distance buckets, then the
exact distances of the few buckets where the answers lie. Those buckets can be foreseen. A sample of the pairs
(the first tile of rows against every column, cut into row groups) gives FMR at every bucket end, and the
spread over the groups a standard error. FNMR comes from every positive pair when they are few (listed from the
labels, with their canonical distances: within a float32 step or so of the pass's, where a bucket spans
hundreds), else from the sample like FMR. Every bucket that could hold an answer with the rates anywhere within
``plan.Z`` standard errors (and ``plan.SHIFT`` buckets for the listed positives) is *tracked*: in the histogram
pass, the pairs of the tracked buckets are also counted by exact float32 value (a few windows of consecutive float32
values, one counter per value and sign). These counts are the distinct distances with their multiplicities,
which the second pass would list. If every bucket the answers need was tracked, and the counts match the
histograms bucket by bucket, the second pass is skipped; otherwise it runs. The values are exact either way:
only the time depends on the sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._pairs import plan as pairs_plan
from torchmetrics_retrieval.functional._pairs.rates import Counted, RateRequest, _weights
from torchmetrics_retrieval.functional._search.float_order import ordered_key

__all__ = ["Sample", "Windows", "from_keys", "likely_buckets", "ordered_keys"]

#: ``Windows.delta`` of a bucket that is not tracked.
UNTRACKED = np.iinfo(np.int64).min


class Sample(NamedTuple):
    """What the buckets are foreseen from: the histograms of a sample of the pairs, ``(pairs_plan.GROUPS, 2 n_buckets)``
    (negatives then positives, one row per group of rows), and the histogram of every positive pair's canonical
    distance (None when there are too many to list); and the number of ordered pairs of the pass."""

    groups: Tensor
    positives: Tensor | None
    n_pairs: int


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """int64 keys of float32 values, in the same order as the values (``float_order.ordered_key``, as the kernels
    compute them; -0.0 and +0.0 share a key).

    Example:
        >>> ordered_keys(np.array([-1.0, -0.0, 0.0, 1e-45, 1.0], dtype=np.float32)).tolist()
        [-1065353216, 0, 0, 1, 1065353216]
        >>> from_keys(np.array([-1065353216, 1065353216])).tolist()
        [-1.0, 1.0]
    """
    return ordered_key(np.ascontiguousarray(values, dtype=np.float32).view(np.int32).astype(np.int64))


def from_keys(keys: np.ndarray) -> np.ndarray:
    """The float32 values of :func:`ordered_keys`' keys."""
    return ordered_key(np.asarray(keys, dtype=np.int64)).astype(np.int32).view(np.float32)


class _Shares(NamedTuple):
    """The share of a sign's pairs at or below every bucket end, pooled (``(n_buckets,)``) and per group (rows of
    ``groups``: the sample's groups, or the one row of every listed pair), over ``n`` pairs (inf: listed)."""

    pooled: Tensor
    groups: Tensor
    n: float


def _sampled(cumulative: Tensor) -> _Shares | None:
    """The shares of the sample's groups (``cumulative``: ``(GROUPS, n_buckets)`` cumulative counts); None when
    the sample is too small."""
    totals = cumulative[:, -1].to(torch.float64)
    n = float(totals.sum())
    if n < pairs_plan.MIN_SAMPLE:
        return None
    present = totals > 0
    pooled = cumulative.sum(dim=0).to(torch.float64) / n
    return _Shares(pooled, cumulative[present].to(torch.float64) / totals[present, None], n)


def _error(shares: _Shares, groups: Tensor, pooled: Tensor) -> Tensor:
    """``plan.Z`` standard errors of ``pooled``, a share (or a difference of shares) estimated by ``groups``: the
    spread over the groups, at least the binomial one (zero for listed pairs)."""
    if math.isinf(shares.n):
        return torch.zeros_like(pooled)
    spread = groups.std(dim=0) / groups.shape[0] ** 0.5 if groups.shape[0] > 1 else torch.zeros_like(pooled)
    binomial = (pooled.abs() * (1 - pooled.abs()) / shares.n).sqrt()
    return torch.maximum(spread, binomial) * pairs_plan.Z + pairs_plan.Z / shares.n


def _shifted(values: Tensor, by: int, fill: float) -> Tensor:
    """``values[b - by]`` at every ``b`` (``fill`` beyond the ends)."""
    out = torch.full_like(values, fill)
    if by >= 0:
        out[by:] = values[: values.numel() - by]
    else:
        out[:by] = values[-by:]
    return out


def _before(values: Tensor, first: float) -> Tensor:
    """``values`` at the previous bucket end (``first`` before the first bucket), along the last dimension."""
    return torch.cat([values.new_full((*values.shape[:-1], 1), first), values[..., :-1]], dim=-1)


def _bounds(shares: _Shares) -> tuple[Tensor, Tensor]:
    """Low and high bounds of the share at every bucket end (a listed share may move by ``plan.SHIFT`` buckets)."""
    if math.isinf(shares.n):
        return _shifted(shares.pooled, pairs_plan.SHIFT, 0.0), _shifted(shares.pooled, -pairs_plan.SHIFT, 1.0)
    error = _error(shares, shares.groups, shares.pooled)
    return (shares.pooled - error).clamp(0, 1), (shares.pooled + error).clamp(0, 1)


def _hull(marked: Tensor) -> Tensor:
    """Every bucket from the first marked one to the last."""
    hull = torch.zeros_like(marked)
    found = torch.nonzero(marked).flatten()
    if found.numel():
        hull[int(found[0]) : int(found[-1]) + 1] = True
    return hull


def _cheaper(negatives: _Shares, positives: _Shares, miss: float, false_alarm: float) -> Tensor:
    """The buckets whose DCF may drop below that of the pooled best bucket end (minDCF's buckets): DCF falls to
    at least ``miss FNMR(b end) + false_alarm FMR(b - 1 end)`` inside bucket b. Bounded as differences with the
    best end, whose errors are far smaller than those of the rates (the same pairs count in both)."""
    fmr, fnmr = negatives.pooled, 1 - positives.pooled
    costs = miss * fnmr + false_alarm * fmr
    best = int(torch.argmin(costs))
    if float(costs[best]) >= miss:  # rejecting every pair (t = -inf) may be best: bound every bucket
        fmr_low, _ = _bounds(negatives)
        _, share_high = _bounds(positives)
        return miss * (1 - share_high) + false_alarm * _before(fmr_low, 0.0) < miss
    # FMR: from the best end back to each bucket's start, per group
    gap = _before(fmr, 0.0) - fmr[best]
    gap_low = gap - _error(negatives, _before(negatives.groups, 0.0) - negatives.groups[:, best : best + 1], gap)
    # FNMR: a listed share moves by pairs_plan.SHIFT buckets; a sampled one is bounded like FMR
    if math.isinf(positives.n):
        fnmr_gap_low = (1 - _shifted(positives.pooled, -pairs_plan.SHIFT, 1.0)) - (
            1 - positives.pooled[max(best - pairs_plan.SHIFT, 0)]
        )
    else:
        fnmr_gap = positives.pooled[best] - positives.pooled
        groups_gap = positives.groups[:, best : best + 1] - positives.groups
        fnmr_gap_low = fnmr_gap - _error(positives, groups_gap, fnmr_gap)
    return miss * fnmr_gap_low + false_alarm * gap_low < 0


def likely_buckets(sample: Sample, fractions: tuple[float, ...], request: RateRequest | None) -> Tensor | None:
    """Bool ``(n_buckets,)``: the buckets that may hold an answer; None when the sample is too small."""
    n_buckets = sample.groups.shape[1] // 2
    negatives = _sampled(sample.groups[:, :n_buckets].cumsum(dim=1))
    if sample.positives is None:
        positives = _sampled(sample.groups[:, n_buckets:].cumsum(dim=1))
    elif int(sample.positives.sum()) > 0:
        listed = sample.positives.cumsum(0).to(torch.float64) / int(sample.positives.sum())
        positives = _Shares(listed, listed[None], math.inf)
    else:
        positives = None
    if negatives is None or positives is None:
        return None
    fmr_low, fmr_high = _bounds(negatives)
    share_low, share_high = _bounds(positives)
    fnmr_low, fnmr_high = 1 - share_high, 1 - share_low
    likely = torch.zeros(n_buckets, dtype=torch.bool)
    for f in fractions:  # the quantile's bucket: FMR reaches f at its end, not before it
        likely |= _hull((_before(fmr_low, 0.0) <= f) & (fmr_high >= f))
    if request is None:
        request = RateRequest(False, (), (1.0, 1.0))
    if request.eer:  # the first bucket where FMR - FNMR turns non-negative
        likely |= _hull((fmr_high - fnmr_low >= 0) & (_before(fmr_low - fnmr_high, -1.0) < 0))
    misses, false_alarms = _weights(request, torch.device("cpu"))  # one pair of weights per minDCF target
    for miss, false_alarm in zip(misses.tolist(), false_alarms.tolist(), strict=True):
        likely |= _hull(_cheaper(negatives, positives, miss, false_alarm))
    # the end buckets also hold every value beyond the bounds: no window can hold them
    likely[0] = likely[-1] = False
    return likely


class Windows:
    """The float32 values the histogram pass counts exactly: the values of the ``tracked`` buckets, as a few
    runs of consecutive keys (rows ``(first key, end key, offset)`` of :attr:`table`; a value's counters sit at
    ``offset + 2 (key - first key)``, the negatives', then the positives'). For the kernel, :attr:`span` holds
    the first and last tracked bucket and :attr:`delta` the ``offset - 2 first key`` of each bucket between
    them (``UNTRACKED`` for the others)."""

    def __init__(
        self, tracked: Tensor, table: np.ndarray, delta: np.ndarray, span: tuple[int, int], dtype: type
    ) -> None:
        self.tracked, self.table, self.delta, self.span, self.dtype = tracked, table, delta, span, dtype
        self.size = int(2 * (table[:, 1] - table[:, 0]).sum())
        self.fine: np.ndarray = np.zeros((1, 0), dtype=dtype)

    @classmethod
    def around(cls, tracked: Tensor, low: float, scale: float, n_pairs: int, parts: int) -> Windows | None:
        """The windows of the ``tracked`` buckets of ``floor((d - low) * scale)`` for a pass over ``n_pairs``
        ordered pairs with ``parts`` rows of counters; None beyond ``plan.MAX_BYTES``. A bucket of more than
        ``plan.MAX_BUCKET_KEYS`` float32 values (near 0, where they crowd) is not tracked."""
        buckets = torch.nonzero(tracked).flatten().double().numpy()
        crowded = np.diff(ordered_keys((low + np.stack([buckets, buckets + 1]) / scale).astype(np.float32)), axis=0)
        tracked = tracked.clone()
        tracked[torch.from_numpy(buckets[crowded[0] > pairs_plan.MAX_BUCKET_KEYS]).long()] = False
        padded = torch.cat([tracked.new_zeros(1), tracked, tracked.new_zeros(1)]).to(torch.int8)
        edges = torch.diff(padded)
        starts = torch.nonzero(edges == 1).flatten().numpy()
        ends = torch.nonzero(edges == -1).flatten().numpy()  # one past each run
        if starts.size == 0:
            return None
        # a value of bucket b lies in [low + b / scale, low + (b + 1) / scale] but for roundings far below a
        # float32 step: two steps on each side hold them all (the counts are checked against the histogram)
        first = ordered_keys((low + starts / scale).astype(np.float32)) - 2
        end = ordered_keys((low + ends / scale).astype(np.float32)) + 3
        # runs whose key ranges overlap share a window (the runs come in order)
        opens = np.concatenate([[True], first[1:] > np.maximum.accumulate(end)[:-1]])
        window_of_run = np.cumsum(opens) - 1
        table = np.stack([first[opens], np.maximum.reduceat(end, np.flatnonzero(opens)), np.zeros_like(end[opens])], 1)
        sizes = table[:, 1] - table[:, 0]
        dtype = np.int32 if n_pairs < 2**31 else np.int64  # a counter never exceeds the pairs
        if int(sizes.sum()) * 2 * np.dtype(dtype).itemsize * parts > pairs_plan.MAX_BYTES:
            return None
        table[1:, 2] = np.cumsum(2 * sizes)[:-1]
        span = (int(starts[0]), int(ends[-1]) - 1)
        delta = np.full(span[1] - span[0] + 1, UNTRACKED, dtype=np.int64)
        per_run = (table[:, 2] - 2 * table[:, 0])[window_of_run]
        delta[torch.nonzero(tracked).flatten().numpy() - span[0]] = np.repeat(per_run, ends - starts)
        return cls(tracked, table, delta, span, dtype)

    def counters(self, parts: int) -> np.ndarray:
        """Zeroed counters for ``parts`` runs of rows (the histogram kernel's ``fine``), kept for :meth:`read`."""
        self.fine = np.zeros((parts, self.size), dtype=self.dtype)
        return self.fine

    def read(
        self, bucket_of: Callable[[Tensor], Tensor], negative_hist: Tensor, positive_hist: Tensor, needed: Tensor
    ) -> tuple[Counted, Counted] | None:
        """The distinct negative and positive distances of the tracked buckets with their multiplicities, if
        they hold every ``needed`` bucket and match the histograms; else None (the second pass must run)."""
        if bool((needed & ~self.tracked).any()):
            return None
        counts = self.fine.sum(axis=0, dtype=np.int64)
        keys = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b, _ in self.table])
        values = torch.from_numpy(from_keys(keys))
        ids = bucket_of(values).long()
        keep = self.tracked[ids]
        found = []
        for sign, hist in ((0, negative_hist), (1, positive_hist)):
            n = torch.from_numpy(counts[sign::2])
            at = keep & (n > 0)
            per_bucket = torch.zeros_like(hist).index_add_(0, ids[at], n[at])
            if not torch.equal(per_bucket[self.tracked], hist[self.tracked]):
                return None
            found.append(Counted(values[at], n[at]))
        return found[0], found[1]
