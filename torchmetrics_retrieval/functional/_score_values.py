"""The values of given scores (``score_values``, for :mod:`~torchmetrics_retrieval.functional.trials`).

They are those of the all-pairs path with distance = -score (``fnmr@fmr`` and ``tar@far`` at numpy's linear
quantile, ``eer``, ``min_dcf``, ``roc_auc``; ``_pairs.quantiles``, ``_pairs.rates``), plus the ROC point nearest a
FAR, ``act_dcf``, ``cllr`` and ``min_cllr``. Here the scores are all at hand, so they come from one sort and linear
passes (``_score_kernels``): the target and non-target scores split apart and cut into value ranges (one per
thread), each range sorted, one sweep over the sorted scores group by distinct score (a value range per thread),
and the Cllr sums in a pass of their own, every pass on one pool of threads. The rates are the same int64 counts
over the same totals as the all-pairs path's, so the same float64 values.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._pairs.quantiles import Curve, Statistics, _lerp, _quantile_ranks
from torchmetrics_retrieval.functional._pairs.rates import _weights
from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads
from torchmetrics_retrieval.functional._trial_request import TrialRequest
from torchmetrics_retrieval.functional.verification import statistics_keys

__all__ = ["score_values"]


class _Sweep(NamedTuple):
    """What one sweep over the sorted scores found (see ``_score_kernels.sweep``)."""

    rates: dict[str, Tensor]
    thresholds: Tensor
    fnmr: Tensor
    auc: tuple[int, int]
    cllr_sums: tuple[float, float]
    blocks: np.ndarray
    groups: np.ndarray
    act_counts: dict[float, tuple[int, int]]
    sizes: tuple[int, int]


def score_values(scores: Tensor, is_target: Tensor, request: TrialRequest) -> dict[str, Tensor]:
    """Every value ``request`` asks for (float32, 0-dim, on the scores' device) from checked scores and flags."""
    fmr_vals, rates, roc_auc, cllr, act_p, far_rule = request
    nearest = far_rule == "nearest_roc_point" and bool(fmr_vals)
    exact = () if nearest else fmr_vals
    found = _sweep(scores, is_target, exact, request, nearest)
    n_pos, n_neg = found.sizes
    device = scores.device
    out: dict[str, Tensor] = {}
    if exact or rates.eer or rates.p_targets:
        out.update(statistics_keys(Statistics(Curve(found.thresholds, found.fnmr), found.rates, {}), exact))
        out = {key: value.to(device) for key, value in out.items()}
    if nearest:
        tar = _nearest_roc_tar(found.groups[0, ::-1].copy(), found.groups[1, ::-1].copy(), fmr_vals).to(device)
        out = {
            **{f"fnmr@fmr/{f}": 1 - tar[i] for i, f in enumerate(fmr_vals)},
            **{f"tar@far/{f}": tar[i] for i, f in enumerate(fmr_vals)},
            **out,
        }
    if roc_auc:  # (target, non-target) couples with the target scoring higher, ties counting one half
        below, equal = found.auc
        area = (below + 0.5 * equal) / (n_pos * n_neg)
        out["roc_auc"] = torch.tensor(area, dtype=torch.float32, device=device)
    c_miss, c_fa = rates.costs
    for p in act_p:
        missed, accepted = found.act_counts[p]
        cost = (c_miss * p * (missed / n_pos) + c_fa * (1 - p) * (accepted / n_neg)) / min(c_miss * p, c_fa * (1 - p))
        out[f"act_dcf/{p}"] = torch.tensor(cost, dtype=torch.float32, device=device)
    if cllr:
        tar_sum, non_sum = found.cllr_sums
        value = (tar_sum / n_pos + non_sum / n_neg) / (2 * math.log(2))
        out["cllr"] = torch.tensor(value, dtype=torch.float32, device=device)
        out["min_cllr"] = _min_cllr(found.blocks).to(device=device, dtype=torch.float32)
    return out


def _working_scores(scores: Tensor) -> np.ndarray:
    """The scores as the values are computed from them: float32 or float64 (an integer dtype as float64, a
    half-precision one as float32, both exactly)."""
    dtype = torch.promote_types(scores.dtype, torch.float32) if scores.is_floating_point() else torch.float64
    return scores.detach().to(device="cpu", dtype=dtype).contiguous().numpy()


def _share(pool: ThreadPoolExecutor | None, threads: int, kernel: Any, n_tasks: int, *args: Any) -> None:
    """``kernel(*args, first, last)`` over the tasks ``0`` to ``n_tasks``, cut into ``threads`` runs of about equal
    size, one per thread of ``pool`` (None: all on this thread). The kernels release the GIL, so the passes and the
    sorts between them share one set of threads instead of two pools (the sorts' and numba's)."""
    if pool is None:
        kernel(*args, 0, n_tasks)
        return
    cuts = [n_tasks * t // threads for t in range(threads + 1)]
    list(pool.map(lambda t: kernel(*args, cuts[t], cuts[t + 1]), range(threads)))


def _sorted_kinds(
    values: np.ndarray, flags: np.ndarray, threads: int, pool: ThreadPoolExecutor | None, kernels: Any
) -> tuple[np.ndarray, int]:
    """The target scores, sorted, then the non-target scores, sorted, in one array, and the number of targets.

    The scores are split by kind (chunks shared out over the threads), each kind is cut into ``threads`` value
    ranges at the same scores (:func:`_partitioned`), and the ranges are sorted ``threads`` at a time (numpy's SIMD
    sort releases the GIL): each kind is then sorted, with nothing to merge. Every step moves values only, so the
    result does not depend on the threads (but for the order of -0.0 and +0.0, which compare equal)."""
    n_chunks = max(1, -(-values.size // kernels.CHUNK))
    counts = np.empty((n_chunks, 2), dtype=np.int64)
    _share(pool, threads, kernels.chunk_counts, n_chunks, flags, kernels.CHUNK, counts)
    n_pos = int(counts[:, 0].sum())
    at = np.cumsum(counts, axis=0) - counts  # each chunk's first position in its kind, chunks in order
    at[:, 1] += n_pos
    out = np.empty_like(values)
    _share(pool, threads, kernels.split, n_chunks, values, flags, kernels.CHUNK, at, out)
    out, bounds = _partitioned(out, np.array([0, n_pos, values.size]), _pivots(values, threads), threads, pool, kernels)
    pieces = [out[a:b] for a, b in itertools.pairwise(bounds)]
    if pool is None:
        for p in pieces:
            p.sort()
    else:  # the largest first, for balance
        list(pool.map(np.ndarray.sort, sorted(pieces, key=len, reverse=True)))
    return out, n_pos


def _pivots(values: np.ndarray, threads: int) -> np.ndarray:
    """``threads - 1`` scores, ascending, that cut a sample of every score into parts of equal size: the bounds of
    the value ranges sorted side by side (of equal size, as the sort's time is the number of scores). Only the
    balance of the threads depends on them, not a value."""
    sample = np.sort(values[:: max(1, values.size // 4096)])
    return sample[sample.size * np.arange(1, threads) // threads].astype(np.float64)


def _partitioned(
    src: np.ndarray, bounds: np.ndarray, pivots: np.ndarray, threads: int, pool: ThreadPoolExecutor | None, kernels: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The segments ``src[bounds[s]:bounds[s + 1]]`` each cut at every pivot, segment by segment in order: the
    array and the ``(len(bounds) - 1) * (len(pivots) + 1) + 1`` bounds of its parts.

    A segment is halved at the middle one of its pivots in each round (those below it, then the others), so
    ``log2(threads)`` rounds make every cut; a round is one count and one branch-free copy of every score, in
    chunks shared out over the threads."""
    segments = [(lo, hi, 0, pivots.size) for lo, hi in itertools.pairwise(bounds.tolist())]  # with their pivots
    spare = np.empty_like(src) if pivots.size else src
    while any(a < b for _, _, a, b in segments):
        firsts = [np.arange(lo, hi, kernels.CHUNK) for lo, hi, _, _ in segments]
        chunk_lo = np.concatenate([*firsts, [src.size]])
        owner = np.repeat(np.arange(len(segments)), [f.size for f in firsts])  # each chunk's segment
        middle = [(a + b) // 2 for _, _, a, b in segments]
        cut = np.array([pivots[m] if a < b else np.inf for m, (_, _, a, b) in zip(middle, segments, strict=True)])
        n_chunks = owner.size
        above = np.empty(n_chunks, dtype=np.int64)
        _share(pool, threads, kernels.above_counts, n_chunks, src, chunk_lo, cut[owner], above)
        below = np.diff(chunk_lo) - above
        first_chunk = np.cumsum([0, *(f.size for f in firsts)])[:-1][owner]  # of each chunk's segment
        low_sizes = np.bincount(owner, weights=below, minlength=len(segments)).astype(np.int64)
        lows = np.array([lo for lo, _, _, _ in segments])
        at = np.empty((n_chunks, 2), dtype=np.int64)
        for column, counted, base in ((0, below, lows), (1, above, lows + low_sizes)):
            before = np.cumsum(counted) - counted  # in the chunks before, from the segment's first chunk on
            at[:, column] = base[owner] + before - before[first_chunk]
        _share(pool, threads, kernels.partition, n_chunks, src, spare, chunk_lo, cut[owner], at)
        src, spare = spare, src
        segments = [
            part
            for (lo, hi, a, b), m, n_low in zip(segments, middle, low_sizes.tolist(), strict=True)
            for part in (((lo, lo + n_low, a, m), (lo + n_low, hi, m + 1, b)) if a < b else ((lo, hi, a, b),))
        ]
    return src, np.array([segments[0][0], *(hi for _, hi, _, _ in segments)], dtype=np.int64)


def _value_ranges(tar: np.ndarray, non: np.ndarray, threads: int) -> np.ndarray:
    """``starts[k, r]``: where value range ``r`` of the sweep starts in the sorted scores of kind ``k`` (0 targets, 1
    non-targets): ``threads`` ranges cut at scores taken from both kinds alike, so that equal scores fall in one
    range, and the targets, which cost the sweep most, are shared out too (not the ranges of the sort, cut by the
    number of scores). Only the balance of the threads depends on them, not a value."""
    starts = np.zeros((2, threads + 1), dtype=np.int64)
    starts[0, -1], starts[1, -1] = tar.size, non.size
    if threads > 1:
        sample = np.sort(np.concatenate([tar[:: max(1, tar.size // 1024)], non[:: max(1, non.size // 1024)]]))
        cuts = sample[sample.size * np.arange(1, threads) // threads]
        starts[0, 1:-1], starts[1, 1:-1] = np.searchsorted(tar, cuts), np.searchsorted(non, cuts)
    return starts


def _sweep(
    scores: Tensor, is_target: Tensor, fmr_vals: tuple[float, ...], request: TrialRequest, nearest: bool
) -> _Sweep:
    """One split, one sort and one sweep over the sorted scores (``_score_kernels``), for every value at once."""
    kernels = importlib.import_module("torchmetrics_retrieval.functional._score_kernels")
    threads = kernel_threads()
    values, flags = _working_scores(scores), is_target.detach().cpu().contiguous().numpy()
    with ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool:
        return _sweep_on(values, flags, fmr_vals, request, nearest, threads, pool, kernels)


def _sweep_on(
    values: np.ndarray,
    flags: np.ndarray,
    fmr_vals: tuple[float, ...],
    request: TrialRequest,
    nearest: bool,
    threads: int,
    pool: ThreadPoolExecutor | None,
    kernels: Any,
) -> _Sweep:
    """:func:`_sweep` on the working scores, ``threads`` threads of ``pool`` sharing every pass."""
    n_chunks = max(1, -(-values.size // kernels.CHUNK))
    sums = np.zeros((n_chunks if request.cllr else 0, 2))
    if request.cllr:
        _share(pool, threads, kernels.cllr_sums, n_chunks, values, flags, kernels.CHUNK, kernels.EXP_TABLE, sums)
    both, n_pos = _sorted_kinds(values, flags, threads, pool, kernels)
    tar, non = both[:n_pos], both[n_pos:]
    n_neg = non.size
    starts = _value_ranges(tar, non, threads)
    # the non-target order statistics of numpy's linear quantile of the distances -score (ranks ascending distance)
    f = torch.tensor(fmr_vals, dtype=torch.float64)
    low_rank, high_rank, gamma = _quantile_ranks(n_neg, f)
    rank_values = non[n_neg - 1 - torch.cat([low_rank, high_rank]).numpy()].astype(np.float64)  # (sorted)
    miss, fa = (w.numpy() for w in _weights(request.rates, torch.device("cpu")))
    blocks = np.empty((2, values.size if request.cllr else 0), dtype=np.int64)
    groups = np.empty((2, values.size if nearest else 0), dtype=np.int64)
    n_ranges = starts.shape[1] - 1
    reached = np.empty((n_ranges, 4 + 2 * miss.size), dtype=np.int64)
    counts = np.empty((n_ranges, 4), dtype=np.int64)
    weights = np.stack([miss / n_pos, fa / n_neg])
    _share(
        pool, threads, kernels.sweep, n_ranges, tar, non, starts, weights, request.cllr, blocks, groups, reached, counts
    )
    # the thresholds found (rejecting t targets and n non-targets), ascending, then "accept nothing" (P, N)
    candidates = reached[:, :4].reshape(-1, 2)
    candidates = np.concatenate([candidates[candidates[:, 0] >= 0], [[n_pos, n_neg]]])
    frr = candidates[:, 0].astype(np.float64) / n_pos  # the rates of _pairs.rates, to the bit
    far = (n_neg - candidates[:, 1]).astype(np.float64) / n_neg
    found: dict[str, Tensor] = {}
    if request.rates.eer:  # the smallest |FAR - FRR|, the last (the highest threshold) on a tie
        gaps = np.abs(far - frr)
        best = gaps.size - 1 - int(np.argmin(gaps[::-1]))
        found["eer"] = torch.tensor((far[best] + frr[best]) / 2, dtype=torch.float64)
    for k, p in enumerate(request.rates.p_targets):  # each range's cheapest threshold, and "accept nothing"
        rejected = np.concatenate([reached[:, 4 + 2 * k : 6 + 2 * k], [[n_pos, n_neg]]])
        costs = miss[k] * (rejected[:, 0] / n_pos) + fa[k] * ((n_neg - rejected[:, 1]) / n_neg)
        found[f"min_dcf/{p}"] = torch.tensor(costs.min(), dtype=torch.float64)
    below, equal = (int(v) for v in counts[:, :2].sum(axis=0))
    if request.cllr:
        blocks = blocks[:, : kernels.pool_ranges(blocks, starts, counts[:, 2].copy())]
    if nearest:
        bases = starts.sum(axis=0)
        groups = np.concatenate([groups[:, b : b + g] for b, g in zip(bases[:-1], counts[:, 3], strict=True)], axis=1)
    distances = -torch.from_numpy(rank_values)  # low ranks, then high ranks
    thresholds = _lerp(distances[: f.numel()], distances[f.numel() :], gamma)
    # a target's distance -s is at least T exactly when s <= -T
    at_or_above = [kernels.count_below(tar, -float(t), True) for t in thresholds]
    fnmr = torch.tensor(at_or_above, dtype=torch.int64).to(torch.float64) / n_pos
    c_miss, c_fa = request.rates.costs
    act_counts = {}
    for p in request.act_dcf_p_target:  # the Bayes threshold: accept a trial scoring at least it
        bayes = math.log(c_fa * (1 - p) / (c_miss * p))
        act_counts[p] = (kernels.count_below(tar, bayes, False), n_neg - kernels.count_below(non, bayes, False))
    tar_sum, non_sum = (math.fsum(sums[:, k].tolist()) for k in (0, 1))  # in chunk order, exactly
    return _Sweep(
        found, thresholds, fnmr, (below, equal), (tar_sum, non_sum), blocks, groups, act_counts, (n_pos, n_neg),
    )  # fmt: skip


def _nearest_roc_tar(n_tar: np.ndarray, n_non: np.ndarray, fmr_vals: tuple[float, ...]) -> Tensor:
    """TAR (float32, per FAR value) at the ROC point nearest it, as insightface's IJB tables read it, from the trials'
    counts at each distinct score, from the highest down (:func:`_tied_counts`).

    The points are scikit-learn's ``roc_curve`` (with its default ``drop_intermediate``): one per distinct score
    (accept the trials scoring at least that), the points inside a run of equal steps dropped, (0, 0) first. Ties in
    ``|FAR - f|`` go to the point of larger FAR (the rates' order from the most accepting point on, the first one
    found)."""
    tps = torch.from_numpy(n_tar).cumsum(0).to(torch.float64)
    fps = torch.from_numpy(n_non).cumsum(0).to(torch.float64)
    if tps.numel() > 2:  # the middle of three points with equal steps lies on the line between the other two
        keep = torch.ones_like(tps, dtype=torch.bool)
        keep[1:-1] = (torch.diff(fps, 2) != 0) | (torch.diff(tps, 2) != 0)
        tps, fps = tps[keep], fps[keep]
    zero = torch.zeros(1, dtype=torch.float64)
    far = torch.cat([zero, fps]) / fps[-1]
    tar = torch.cat([zero, tps]) / tps[-1]
    far, tar = far.flip(0), tar.flip(0)  # argmin returns the first of the nearest: the one of larger FAR
    at = torch.stack([torch.argmin((far - f).abs()) for f in fmr_vals])  # a few FAR values, each a pass
    return tar[at].to(torch.float32)


def _min_cllr(blocks: np.ndarray) -> Tensor:
    """Cllr after the best monotonic calibration, from the pool-adjacent-violators blocks of the groups of tied
    scores (``blocks[0]``: targets, ``blocks[1]``: trials; ``_score_kernels.sweep``): the target rate ``q`` of each
    block is the posterior, at the empirical prior ``P / (P + N)``; the log-likelihood ratio is
    ``logit(q) - log(P / N)``. A block of targets alone (``q = 1``) or non-targets alone (``q = 0``) costs nothing."""
    tar = torch.from_numpy(blocks[0]).to(torch.float64)
    non = torch.from_numpy(blocks[1]).to(torch.float64) - tar
    q = tar / (tar + non)  # float64
    n_target, n_nontarget = int(blocks[0].sum()), int(blocks[1].sum() - blocks[0].sum())
    prior_odds = n_target / n_nontarget  # P / N: the calibrated LLR is logit(q) - log(P / N)
    # target cost log(1 + e^-llr) = log(1 + (1 - q) / q * P / N), non-target cost log(1 + q / (1 - q) * N / P);
    # only where they occur (q > 0 in a block holding a target, q < 1 in a block holding a non-target)
    tar_cost = torch.where(tar > 0, torch.log1p((1 - q) / q.clamp(min=1e-300) * prior_odds), 0.0)
    non_cost = torch.where(non > 0, torch.log1p(q / (1 - q).clamp(min=1e-300) / prior_odds), 0.0)
    total = (tar * tar_cost).sum() / n_target + (non * non_cost).sum() / n_nontarget
    return total / (2 * math.log(2))
