"""The numba kernel of the exact ROC AUC pass (``auc``), compiled on first use and cached on disk,
parallel over rows on the threads ``buffer.kernel_threads`` sets.

A block holds float64 inner products from one matrix product. Each entry's distance is computed from them by the
canonical formula with a rigorous error bound ``err`` (both the block's and the canonical products are within
``e_dot = dot_bound * |q| |g|`` of the exact value, so of each other within twice that); the two ends of that
bracket are rounded to float32. Where they round alike the float32 canonical distance is known without computing
it; elsewhere (about one pair in ten million, and near-duplicates under L2) the pair is left to the caller.
A known negative distance ``c`` is then placed among the sorted positive distances with a lookup table
(``lut[b]``: the first positive in bucket ``b`` or later, so bucket ``b`` holds ``lut[b]`` to ``lut[b + 1]``): an
empty bucket answers at once, a crowded one is halved down to a short walk. It adds the positives strictly below
``c`` and those equal to it. Modes: 0 ``dot``, 1 ``cosine``, 2 ``sqeuclidean``, 3 ``euclidean``. ``mask``: the
block's eligibility, or a single row of True for every row.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

pjit = numba.njit(cache=True, nogil=True, parallel=True)
inline = numba.njit(cache=True, nogil=True, inline="always")

_U = 2.0**-53  # float64 unit roundoff


@inline
def _bracket(dot, q_sq, g_sq, q_norm, g_norm, mode, dot_bound):
    """``(low, high, known)``: the float32 roundings of the ends of the distance's bracket. Written without a
    branch on the data (``mode`` is the same for the whole block), so that the row loop vectorises."""
    e_dot = 2.0 * dot_bound * q_norm * g_norm
    if mode == 0:
        low = -dot - e_dot
        high = -dot + e_dot
        known = True
    elif mode == 1:
        norm = np.sqrt(q_sq * g_sq)
        slack = 8.0 * _U  # the division and the square root of the canonical formula
        low = 1.0 - (dot + e_dot) / norm - slack
        high = 1.0 - (dot - e_dot) / norm + slack
        known = True
    else:
        scale = q_sq + g_sq
        squared = scale - 2.0 * dot
        known = squared >= scale * 2.0**-9  # below, cancellation: the canonical value takes the direct sum
        e_sq = 2.0 * e_dot + 8.0 * _U * scale
        low = max(squared - e_sq, 0.0)
        high = squared + e_sq
        if mode == 3:
            low = np.sqrt(low) * (1.0 - 2.0 * _U)
            high = np.sqrt(high) * (1.0 + 2.0 * _U)
    return np.float32(low), np.float32(high), known


@inline
def _place(c, positives, lut, first, inv_width, n_buckets):
    """``(below, equal)``: the positives strictly below ``c`` and those equal to it."""
    n = positives.size
    if c < positives[0]:
        return 0, 0
    if c > positives[n - 1]:
        return n, 0
    b = np.int64(min((np.float64(c) - first) * inv_width, n_buckets - 1.0))
    # the positives of c's bucket: every positive before it is below c, every one after it above
    k, end = lut[b], lut[b + 1]
    if k == end:  # no positive in the bucket (most of them where the negatives lie): no positive to read
        return k, 0
    while end - k > 8:  # a crowded bucket: halve it
        mid = (k + end) >> 1
        if positives[mid] < c:
            k = mid + 1
        else:
            end = mid
    while positives[k] < c:
        k += 1
    e = k
    while e < n and positives[e] == c:
        e += 1
    return k, e - k


@pjit
def count_block(dots, q_sq, g_sq, q_norm, g_norm, mode, dot_bound, col0, own, mask, row_ids, col_ids, table, out):
    """Per row of the block: ``out[i] = (positives below, positives equal, undecided negatives)`` summed over the
    row's eligible negative pairs (``table``: ``(positives, lut, first, inv_width, n_buckets)``).

    Two loops per row: the first, without a branch on the data, brackets every pair and keeps the lookup bucket
    of each decided negative inside the positives' range (-1 for the others); the second places them. Apart,
    the first vectorises and the second's table reads overlap (measured: half the time of one fused loop)."""
    positives, lut, first, inv_width, n_buckets = table
    n_rows, n_cols = dots.shape
    n = positives.size
    smallest, largest = positives[0], positives[n - 1]
    last_bucket = n_buckets - 1.0
    for i in prange(n_rows):
        value = np.empty(n_cols, dtype=np.float32)
        bucket = np.empty(n_cols, dtype=np.int64)
        row_id, own_col, row_sq, row_norm = row_ids[i], own[i] - col0, q_sq[i], q_norm[i]
        row_mask = mask[min(np.int64(i), mask.shape[0] - 1)]  # one row of True without a mask
        undecided = 0
        above = 0  # decided negatives beyond every positive
        for j in range(n_cols):
            low, high, known = _bracket(dots[i, j], row_sq, g_sq[j], row_norm, g_norm[j], mode, dot_bound)
            skipped = (row_id == col_ids[j]) | (own_col == j) | ~row_mask[j]
            unsure = (~known | (low != high)) & ~skipped
            decided = ~(skipped | unsure)
            undecided += int(unsure)
            above += int(decided & (low > largest))
            value[j] = low
            inside = decided & (low >= smallest) & (low <= largest)
            b = min(max((np.float64(low) - first) * inv_width, 0.0), last_bucket)
            bucket[j] = np.int64(b) if inside else -1
        below = above * n
        equal = 0
        for j in range(n_cols):
            b = bucket[j]
            if b < 0:
                continue
            k = lut[b]
            if k == lut[b + 1]:  # no positive in the bucket (most of them where the negatives lie)
                below += k
            else:
                k, e = _place(value[j], positives, lut, first, inv_width, n_buckets)
                below += k
                equal += e
        out[i, 0] = below
        out[i, 1] = equal
        out[i, 2] = undecided


@pjit
def list_undecided(
    dots, q_sq, g_sq, q_norm, g_norm, mode, dot_bound, col0, own, mask, row_ids, col_ids, rows, offsets, out
):
    """The block columns of the negatives :func:`count_block` left undecided in the block rows ``rows`` (those
    where it counted some): row ``rows[t]``'s go to ``out[offsets[t] : offsets[t + 1]]``."""
    for t in prange(rows.shape[0]):
        i = rows[t]
        k = offsets[t]
        row_mask = mask[min(i, mask.shape[0] - 1)]
        for j in range(dots.shape[1]):
            if row_ids[i] == col_ids[j] or own[i] == col0 + j or not row_mask[j]:
                continue
            low, high, known = _bracket(dots[i, j], q_sq[i], g_sq[j], q_norm[i], g_norm[j], mode, dot_bound)
            if not known or low != high:
                out[k] = j
                k += 1
