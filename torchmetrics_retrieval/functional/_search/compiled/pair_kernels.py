"""The numba kernels of the passes over every pair (``functional._pair_passes``): the histogram of the pairs'
distance buckets and the listing of the pairs in chosen buckets, compiled on first use and cached on disk,
parallel over rows on the threads ``buffer.kernel_threads`` sets.

A block holds float32 keys; a pair's distance is ``v = key * scale + offset[row]`` in float32, then as is,
clamped at 0 (mode 1) or clamped and square-rooted (mode 2) (``key_blocks.KeyForm``). Its bucket is computed
in float64 exactly as ``PairBuckets.ids``: ``(d - low) * bucket_scale``, clamped to the buckets, truncated.
A pair is positive when its row's and column's label ids are equal; excluded pairs (``own``, ``mask``: the
block's eligibility, or one row of True for every row) are skipped. ``weight`` is 2 for a symmetric block off
the diagonal, whose entries stand for two ordered pairs.
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


@inline
def _row_slots(keys, r, scale, offset, mode, self_col, mask, label, col_ids, low, bucket_scale, n_buckets, slots):
    """``slots[c]``: row r's pair with column c as an index of ``hist``/``wanted`` (its bucket, plus ``n_buckets``
    when positive), -1 when excluded. Written without a branch on the data, so that the loop vectorises; the
    callers read the slots in a second loop (measured: about half the time of one fused loop)."""
    row_mask = mask[min(np.int64(r), mask.shape[0] - 1)]
    for c in range(keys.shape[1]):
        d = _distance(keys[r, c], scale, offset, mode)
        slot = _bucket(d, low, bucket_scale, n_buckets) + n_buckets * np.int64(col_ids[c] == label)
        slots[c] = np.int32(-1) if (c == self_col) | ~row_mask[c] else np.int32(slot)


@pjit
def histogram(keys, form, col0, own, mask, row_ids, col_ids, weight, buckets, hist):
    """Add every eligible pair's bucket to ``hist`` ``(threads, 2 n_buckets)``: negatives, then positives (one
    row of counts per thread, summed by the caller: integer sums, so the result does not depend on threads).
    ``mask``: the block's eligibility, or one row of True for every row."""
    scale, offsets, mode = form
    low, bucket_scale = buckets
    n_threads, n_buckets = hist.shape[0], hist.shape[1] // 2
    n_rows = keys.shape[0]
    for t in prange(n_threads):
        slots = np.empty(keys.shape[1], dtype=np.int32)
        for r in range(n_rows * t // n_threads, n_rows * (t + 1) // n_threads):
            _row_slots(
                keys, r, scale, offsets[r], mode, own[r] - col0, mask, row_ids[r], col_ids, low, bucket_scale,
                n_buckets, slots,
            )  # fmt: skip
            for c in range(keys.shape[1]):
                if slots[c] >= 0:
                    hist[t, slots[c]] += weight


@pjit
def count_wanted(keys, form, col0, own, mask, row_ids, col_ids, buckets, wanted, counts):
    """Per row, the number of pairs whose (bucket, sign) is ``wanted`` (``(2 n_buckets,)``, as ``hist``)."""
    scale, offsets, mode = form
    low, bucket_scale = buckets
    n_buckets = wanted.shape[0] // 2
    for r in prange(keys.shape[0]):
        slots = np.empty(keys.shape[1], dtype=np.int32)
        _row_slots(
            keys, r, scale, offsets[r], mode, own[r] - col0, mask, row_ids[r], col_ids, low, bucket_scale,
            n_buckets, slots,
        )  # fmt: skip
        found = 0
        for c in range(keys.shape[1]):
            found += int(slots[c] >= 0 and wanted[slots[c]])
        counts[r] = found


@pjit
def list_wanted(keys, form, col0, own, mask, row_ids, col_ids, buckets, wanted, offsets, out_d, out_p):
    """The distances and signs of the wanted pairs, row r's from ``offsets[r]`` (``count_wanted``'s counts)."""
    scale, row_offsets, mode = form
    low, bucket_scale = buckets
    n_buckets = wanted.shape[0] // 2
    for r in prange(keys.shape[0]):
        if offsets[r + 1] == offsets[r]:
            continue
        slots = np.empty(keys.shape[1], dtype=np.int32)
        _row_slots(
            keys, r, scale, row_offsets[r], mode, own[r] - col0, mask, row_ids[r], col_ids, low, bucket_scale,
            n_buckets, slots,
        )  # fmt: skip
        at = offsets[r]
        for c in range(keys.shape[1]):
            if slots[c] >= 0 and wanted[slots[c]]:
                out_d[at] = _distance(keys[r, c], scale, row_offsets[r], mode)
                out_p[at] = slots[c] >= n_buckets
                at += 1
