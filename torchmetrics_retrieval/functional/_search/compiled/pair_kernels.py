"""The numba kernels of the passes over every pair (``functional._pair_passes``): the histogram of the pairs'
distance buckets and the listing of the pairs in chosen buckets, compiled on first use and cached on disk,
parallel over rows on the threads ``buffer.kernel_threads`` sets.

A block holds float32 keys; a pair's distance is ``v = key * scale + offset[row]`` in float32, then as is,
clamped at 0 (mode 1) or clamped and square-rooted (mode 2) (``key_blocks.KeyForm``). Its bucket is computed
in float64 exactly as ``PairBuckets.ids``: ``(d - low) * bucket_scale``, clamped to the buckets, truncated.
A pair is positive when its row's and column's label ids are equal; excluded pairs (``own``, ``mask``) are
skipped. ``weight`` is 2 for a symmetric block off the diagonal, whose entries stand for two ordered pairs.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

pjit = numba.njit(cache=True, nogil=True, parallel=True)
inline = numba.njit(cache=True, nogil=True, inline="always")


@inline
def _distance(key, scale, offset, mode):
    v = key * scale + offset
    if mode == 0:
        return v
    v = max(v, np.float32(0.0))
    return np.sqrt(v) if mode == 2 else v


@inline
def _bucket(d, low, bucket_scale, n_buckets):
    x = (np.float64(d) - low) * bucket_scale
    return np.int64(min(max(x, 0.0), n_buckets - 1.0))


@pjit
def histogram(keys, form, col0, own, mask, has_mask, row_ids, col_ids, weight, buckets, hist):
    """Add every eligible pair's bucket to ``hist`` ``(threads, 2 n_buckets)``: negatives, then positives (one
    row of counts per thread, summed by the caller: integer sums, so the result does not depend on threads)."""
    scale, offsets, mode = form
    low, bucket_scale = buckets
    n_threads, n_buckets = hist.shape[0], hist.shape[1] // 2
    n_rows = keys.shape[0]
    for t in prange(n_threads):
        for r in range(n_rows * t // n_threads, n_rows * (t + 1) // n_threads):
            offset, label, self_col = offsets[r], row_ids[r], own[r] - col0
            for c in range(keys.shape[1]):
                if c == self_col or (has_mask and not mask[r, c]):
                    continue
                b = _bucket(_distance(keys[r, c], scale, offset, mode), low, bucket_scale, n_buckets)
                hist[t, b + n_buckets * np.int64(col_ids[c] == label)] += weight


@inline
def _wanted_row(
    keys, r, scale, offsets, mode, col0, own, mask, has_mask, row_ids, col_ids, low, bucket_scale, wanted, out_d,
    out_p, at,
):  # fmt: skip
    # Row r's pairs whose (bucket, sign) is wanted: counted, and written from ``at`` when ``out_d`` is not empty.
    # The callers unpack ``form`` and ``buckets`` once per block: unpacking a tuple that holds an array, once per
    # row, counts references on it.
    n_buckets = wanted.shape[0] // 2
    offset, label, self_col = offsets[r], row_ids[r], own[r] - col0
    found = 0
    for c in range(keys.shape[1]):
        if c == self_col or (has_mask and not mask[r, c]):
            continue
        d = _distance(keys[r, c], scale, offset, mode)
        positive = col_ids[c] == label
        if wanted[_bucket(d, low, bucket_scale, n_buckets) + n_buckets * np.int64(positive)]:
            if out_d.shape[0]:
                out_d[at + found] = d
                out_p[at + found] = positive
            found += 1
    return found


@pjit
def count_wanted(keys, form, col0, own, mask, has_mask, row_ids, col_ids, buckets, wanted, counts):
    """Per row, the number of pairs whose (bucket, sign) is ``wanted`` (``(2 n_buckets,)``, as ``hist``)."""
    none_d, none_p = np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.bool_)
    scale, offsets, mode = form
    low, bucket_scale = buckets
    for r in prange(keys.shape[0]):
        counts[r] = _wanted_row(
            keys, r, scale, offsets, mode, col0, own, mask, has_mask, row_ids, col_ids, low, bucket_scale, wanted,
            none_d, none_p, 0,
        )  # fmt: skip


@pjit
def list_wanted(keys, form, col0, own, mask, has_mask, row_ids, col_ids, buckets, wanted, offsets, out_d, out_p):
    """The distances and signs of the wanted pairs, row r's from ``offsets[r]`` (``count_wanted``'s counts)."""
    scale, row_offsets, mode = form
    low, bucket_scale = buckets
    for r in prange(keys.shape[0]):
        if offsets[r + 1] > offsets[r]:
            _wanted_row(
                keys, r, scale, row_offsets, mode, col0, own, mask, has_mask, row_ids, col_ids, low, bucket_scale,
                wanted, out_d, out_p, offsets[r],
            )  # fmt: skip
