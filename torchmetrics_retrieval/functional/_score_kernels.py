"""The numba kernels of the values of given scores (``_trials``), compiled on first use and cached on disk.

The score path is one sort plus linear passes, each kernel given a range of its tasks (chunks of scores, value
ranges) so that the caller's threads share them (the kernels release the GIL):

1. :func:`chunk_counts` counts each chunk's targets, :func:`split` copies the target and the non-target scores
   apart, and :func:`cllr_sums` adds up each chunk's Cllr terms;
2. :func:`above_counts` and :func:`partition` cut each kind into value ranges (one per thread), and the caller
   sorts the ranges (numpy's SIMD sort), side by side: their concatenation is sorted, with nothing to merge;
3. :func:`sweep` merges the sorted kinds group by group, a group being one distinct score, ascending, with its
   numbers of targets and non-targets, and reads every value at once: the EER candidate and the detection costs of
   the threshold "accept the trials scoring at least this score", the ROC AUC counts and the
   pool-adjacent-violators blocks of ``min_cllr``.

Scores are compared as floats: -0.0 and +0.0 are one score (the checks refuse NaN). Chunks have a fixed size and
partial sums are combined in chunk order, so no value depends on the number of threads.
"""

from __future__ import annotations

import decimal
import math

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)
fjit = numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
fnjit = numba.njit(cache=True, nogil=True, fastmath=True)

#: Scores per chunk of :func:`split`: a fixed size, so that the partial sums do not depend on the threads.
CHUNK = 2**14
#: Scores whose factors ``1 + e^-|s|`` (in [1, 2]) are multiplied before one logarithm: at most 2^512.
_RUN = 512
#: Below it, ``log(1 + u)`` is summed as ``u - u^2 / 2``.
_TINY = 2.0**-26
#: ``e^-a`` is reduced to ``2^(-k / STEPS) e^-r`` with ``|r| <= log(2) / (2 STEPS)``: a short polynomial for
#: ``e^-r`` and one table read for the power, the table as long as ``a <= 708`` needs.
STEPS = 16
_STEPS_OVER_LN2 = STEPS * 1.4426950408889634
# log(2) / STEPS in two parts, the first with its low 32 bits zero, so that ``k * _HI`` is exact (fdlibm's split
# of log 2, divided by a power of two, exactly)
_HI = 6.93147180369123816490e-01 / STEPS
_LO = 1.90821492927058770002e-10 / STEPS


def _exp_table() -> np.ndarray:
    """``2^(-i / STEPS)`` for every ``i`` a score up to 708 reaches, each correctly rounded: the STEPS fractional
    powers from 30-digit decimals, scaled by exact powers of two."""
    with decimal.localcontext() as context:
        context.prec = 30
        fractions = np.array([float(decimal.Decimal(2) ** (decimal.Decimal(-j) / STEPS)) for j in range(STEPS)])
    i = np.arange(int(708 * _STEPS_OVER_LN2) + 2)
    return np.ldexp(fractions[i % STEPS], -(i // STEPS))


#: ``2^(-i / STEPS)``, read by :func:`_exp_minus`.
EXP_TABLE = _exp_table()


@njit
def chunk_counts(flags, chunk, counts, first, last):
    """``counts[c]``: the (target, non-target) scores of chunk ``c``, for the chunks ``first`` to ``last``."""
    n = flags.size
    for c in range(first, last):
        start, stop = c * chunk, min(n, (c + 1) * chunk)
        n_t = 0
        for i in range(start, stop):
            n_t += flags[i]
        counts[c, 0], counts[c, 1] = n_t, stop - start - n_t


@njit
def split(scores, flags, chunk, at, out, first, last):
    """Copy the scores of chunk ``c`` (``first`` to ``last``) into ``out``: its targets from ``at[c, 0]`` on, its
    non-targets from ``at[c, 1]`` on (see :func:`chunk_counts`), without a branch on the flag."""
    n = scores.size
    for c in range(first, last):
        i_t, i_n = at[c, 0], at[c, 1]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            is_target = flags[i]
            out[i_t if is_target else i_n] = scores[i]
            i_t += is_target
            i_n += 1 - is_target


@njit
def above_counts(src, chunk_lo, pivots, counts, first, last):
    """``counts[c]``: the values of chunk ``c`` (``src[chunk_lo[c]:chunk_lo[c + 1]]``) at or above its pivot
    ``pivots[c]``, for the chunks ``first`` to ``last``."""
    for c in range(first, last):
        p, above = pivots[c], 0
        for i in range(chunk_lo[c], chunk_lo[c + 1]):
            above += src[i] >= p
        counts[c] = above


@njit
def partition(src, dst, chunk_lo, pivots, at, first, last):
    """Copy the values of chunk ``c`` (``first`` to ``last``) into ``dst``: those below its pivot from ``at[c, 0]``
    on, the others from ``at[c, 1]`` on (see :func:`above_counts`), without a branch on the comparison."""
    for c in range(first, last):
        p, i_low, i_high = pivots[c], at[c, 0], at[c, 1]
        for i in range(chunk_lo[c], chunk_lo[c + 1]):
            x = src[i]
            high = x >= p
            dst[i_high if high else i_low] = x
            i_high += high
            i_low += 1 - high


@fjit
def _exp_minus(a, table):
    """``e^-a`` for ``0 <= a <= 708`` to a few ulps, without a call (so that the loop around it vectorises):
    ``a = k log(2) / STEPS + r`` (``r`` exact, ``|r| <= 0.022``), ``e^-r`` by its Taylor series to the 7th term
    (error below 2e-18), times ``table[k] = 2^(-k / STEPS)``."""
    k = np.int32(a * _STEPS_OVER_LN2 + 0.5)  # int32: AVX2 converts doubles to int32 lanes, not to int64
    r = -((a - k * _HI) - k * _LO)
    p = 1.0 / 7.0 * r + 1.0
    for m in range(6, 0, -1):
        p = p * (r / m) + 1.0
    return p * table[k]


@fnjit
def cllr_sums(scores, flags, chunk, table, sums, first, last):
    """``sums[c]`` = the sum over the targets of chunk ``c`` of softplus(-s) = log(1 + e^-s), and over its
    non-targets of softplus(s), each written ``max(+-s, 0) + log(1 + e^-|s|)``.

    ``log(1 + u)``, ``u = e^-|s|``, is summed as the logarithm of the product of the factors ``1 + u`` in [1, 2] over
    runs of 512 scores (at most 2^512: no overflow), one ``log`` per run: a factor is exact to half an ulp of 1, an
    absolute error of 1.1e-16 like ``log1p``'s own. A ``u`` below 2^-26 adds ``u - u^2 / 2`` instead, exact to the
    last bits (a factor 1 + u would keep too few of them). Compiled with fastmath, so that the loop vectorises: the
    sums within a run are reassociated, an error of a few ulps of the run's sum; runs and chunks have fixed sizes,
    so the sums do not depend on the threads."""
    n = scores.size
    for c in range(first, last):
        total_t, total_n = 0.0, 0.0
        for start in range(c * chunk, min(n, (c + 1) * chunk), _RUN):
            prod_t, prod_n, add_t, add_n = 1.0, 1.0, 0.0, 0.0
            for i in range(start, min(n, start + _RUN)):
                x = np.float64(scores[i])
                u = _exp_minus(min(abs(x), 708.0), table)
                tiny = u < _TINY
                factor = 1.0 if tiny else 1.0 + u
                extra = u - 0.5 * u * u if tiny else 0.0
                is_target = flags[i]  # selects, not branches: the loop vectorises
                prod_t *= factor if is_target else 1.0
                prod_n *= 1.0 if is_target else factor
                add_t += max(-x, 0.0) + extra if is_target else 0.0
                add_n += 0.0 if is_target else max(x, 0.0) + extra
            total_t += math.log(prod_t) + add_t
            total_n += math.log(prod_n) + add_n
        sums[c, 0], sums[c, 1] = total_t, total_n


@njit
def count_below(values, bound, inclusive):
    """The number of ``values`` (sorted) whose float64 value is below ``bound`` (at most ``bound`` when
    ``inclusive``): a binary search compared in float64 (numpy's ``searchsorted`` would round ``bound`` to float32)."""
    low, high = 0, values.size
    while low < high:
        mid = (low + high) // 2
        x = np.float64(values[mid])
        if x < bound or (inclusive and x == bound):
            low = mid + 1
        else:
            high = mid
    return low


@njit
def _pool(blocks, base, top, n_t, n_all):
    """Push a group onto the pool-adjacent-violators stack ``blocks[:, base:base + top + 1]`` and merge a block
    whose target rate is not below the next one's (rates compared by cross-multiplying int64 counts); return the new
    top."""
    top += 1
    blocks[0, base + top], blocks[1, base + top] = n_t, n_all
    while top > 0:
        low, high = base + top - 1, base + top
        if blocks[0, low] * blocks[1, high] < blocks[0, high] * blocks[1, low]:
            break
        blocks[0, low] += blocks[0, high]
        blocks[1, low] += blocks[1, high]
        top -= 1
    return top


@njit
def _run_start(values, at, low):
    """The first index of the run of values equal to ``values[at]`` (not before ``low``)."""
    while at > low and values[at - 1] == values[at]:
        at -= 1
    return at


@njit
def sweep(tar, non, starts, weights, with_pav, blocks, groups, found, counts, first, last):
    """Merge the sorted target (``tar``) and non-target (``non``) scores by distinct score, ascending, and find, for
    the thresholds "accept the trials scoring at least s", where each value is reached: each value range ``r``
    (``starts[k, r]`` to ``starts[k, r + 1]`` in the arrays of kind ``k``) on a thread of its own, its results in
    row ``r``. A threshold is given by the targets and non-targets it rejects, ``(t, n)``: FRR = t / P, FAR =
    (N - n) / N.

    * ``found[r, 0:2]``: the last threshold with FAR >= FRR (exactly: ``(N - n) P >= t N``), ``found[r, 2:4]``: the
      first with FAR < FRR; (-1, -1) when there is none. |FAR - FRR| is smallest at one of them: it changes by at
      least 1 / max(N, P) from one threshold to the next, far more than its rounding.
    * ``found[r, 4 + 2 j : 6 + 2 j]``: the threshold of smallest ``weights[0, j] t + weights[1, j] (N - n)``
      (``weights``: the DCF weights over P and N; products instead of the divisions of FRR and FAR, so the cost
      compared may differ from the cost by a few ulps).
    * ``counts[r]``: the (target, non-target) couples in which the target scores higher, and equal; the number of
      pool-adjacent-violators blocks of the range's groups (with ``with_pav``: in ``blocks`` from the range's first
      trial on, ``blocks[0]`` targets, ``blocks[1]`` trials), and the number of its groups (in ``groups`` from the
      same place when ``groups`` is not empty: each group's targets and non-targets).

    Between two distinct target scores lies a run of groups of non-targets only, read in one go: FRR is the same for
    all of them, so the last (the highest) has the smallest cost and the EER crossing is found by integer division;
    they add no ROC AUC couple and pool into one block. Each group holding targets is read on its own. So the work
    per non-target is one comparison, and the few targets (usually) carry the rest."""
    n_pos, n_neg = tar.size, non.size
    keep_groups = groups.shape[1] > 0
    n_costs = weights.shape[1]
    for r in range(first, last):
        i, j = starts[0, r], starts[1, r]
        end_t, end_n = starts[0, r + 1], starts[1, r + 1]
        base = i + j
        last_t, last_n, first_t, first_n = -1, -1, -1, -1
        best = np.full(n_costs, np.inf)
        best_at = np.zeros((n_costs, 2), dtype=np.int64)
        auc_below, auc_equal = 0, 0
        top, g = -1, 0
        run_t, run_all, run_kind = 0, 0, 0  # a run of groups of one kind only (all targets, or none), not yet pooled
        while i < end_t or j < end_n:
            # the non-targets below the next target score: groups of non-targets only, rejecting i targets each
            stop = j
            if i < end_t:
                while stop < end_n and non[stop] < tar[i]:
                    stop += 1
            else:
                stop = end_n
            if stop > j:
                # the crossing: FAR >= FRR while the rejected non-targets n <= bound
                bound = (n_neg * (n_pos - i)) // n_pos
                if bound >= j:
                    last_t, last_n = i, _run_start(non, min(bound, stop - 1), j)
                    after = last_n + 1
                    while after < stop and non[after] == non[last_n]:
                        after += 1
                    if first_t < 0 and after < stop:
                        first_t, first_n = i, after
                elif first_t < 0:
                    first_t, first_n = i, j
                highest = _run_start(non, stop - 1, j)  # the run's cheapest threshold
                for k in range(n_costs):
                    c = weights[0, k] * i + weights[1, k] * (n_neg - highest)
                    if c < best[k]:
                        best[k] = c
                        best_at[k, 0], best_at[k, 1] = i, highest
                if with_pav:
                    if run_all and run_kind != 0:
                        top = _pool(blocks, base, top, run_t, run_all)
                        run_t, run_all = 0, 0
                    run_kind = 0
                    run_all += stop - j
                if keep_groups:
                    at = j
                    while at < stop:
                        end = at + 1
                        while end < stop and non[end] == non[at]:
                            end += 1
                        groups[0, base + g], groups[1, base + g] = 0, end - at
                        g += 1
                        at = end
                else:
                    g += 1  # (the number of groups is only read with groups)
                j = stop
            if i == end_t:
                break
            # the group of the next target score, with the non-targets tied to it
            v = tar[i]
            below_t, below_n = i, j
            while i < end_t and tar[i] == v:
                i += 1
            while j < end_n and non[j] == v:
                j += 1
            n_t, n_n = i - below_t, j - below_n
            if (n_neg - below_n) * n_pos >= below_t * n_neg:
                last_t, last_n = below_t, below_n
            elif first_t < 0:
                first_t, first_n = below_t, below_n
            for k in range(n_costs):
                c = weights[0, k] * below_t + weights[1, k] * (n_neg - below_n)
                if c < best[k]:
                    best[k] = c
                    best_at[k, 0], best_at[k, 1] = below_t, below_n
            auc_below += n_t * below_n
            auc_equal += n_t * n_n
            if with_pav:  # groups of targets only (rate 1) pool whole, like the runs of non-targets (rate 0): push
                kind = 1 if n_n == 0 else 2  # each such run at its end (any order of pooling adjacent violators
                if run_all and (kind != run_kind or kind == 2):  # gives the same fit)
                    top = _pool(blocks, base, top, run_t, run_all)
                    run_t, run_all = 0, 0
                run_kind = kind
                run_t += n_t
                run_all += n_t + n_n
            if keep_groups:
                groups[0, base + g], groups[1, base + g] = n_t, n_n
            g += 1
        if run_all:
            top = _pool(blocks, base, top, run_t, run_all)
        found[r, 0], found[r, 1], found[r, 2], found[r, 3] = last_t, last_n, first_t, first_n
        for k in range(n_costs):
            found[r, 4 + 2 * k], found[r, 5 + 2 * k] = best_at[k, 0], best_at[k, 1]
        counts[r, 0], counts[r, 1], counts[r, 2], counts[r, 3] = auc_below, auc_equal, top + 1, g


@njit
def pool_ranges(blocks, starts, n_blocks):
    """The pool-adjacent-violators blocks of every group from those of each value range (``n_blocks[r]`` blocks
    from ``starts[0, r] + starts[1, r]`` on): pooled again in order (pooling adjacent violators in any order gives the
    same fit), at the front of ``blocks``; returns their number."""
    top = -1
    for r in range(n_blocks.size):
        base = starts[0, r] + starts[1, r]
        for b in range(n_blocks[r]):
            top = _pool(blocks, 0, top, blocks[0, base + b], blocks[1, base + b])
    return top + 1
