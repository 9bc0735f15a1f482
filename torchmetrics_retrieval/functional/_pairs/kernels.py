"""The numba kernels of the passes over every pair (``passes``): the histogram of the pairs'
distance buckets and the listing of the pairs in chosen buckets, compiled on first use and cached on disk,
parallel over rows on the threads ``buffer.kernel_threads`` sets.

A block holds float32 keys; a pair's distance is ``v = key * scale + offset[row]`` in float32, then as is,
clamped at 0 (mode 1) or clamped and square-rooted (mode 2) (``key_blocks.KeyForm``). Its bucket is computed
in float64 exactly as ``PairBuckets.ids``: ``(d - low) * bucket_scale``, clamped to the buckets, truncated.
A pair is positive when its row's and column's label ids are equal; excluded pairs (``own``, ``mask``: the
block's eligibility, or one row of True for every row) are skipped. ``weight`` is 2 for a symmetric block off
the diagonal, whose entries stand for two ordered pairs.

The histogram pass can also count the pairs of chosen buckets by exact float32 value, in a few windows of
consecutive values (indexed by the order-preserving integer key of a float32; ``windows``).
Those counts are the distinct distances with their multiplicities, which the second pass would otherwise list.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from torchmetrics_retrieval.functional._search.float_order import ordered_key

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


#: Added to the slot of a pair whose bucket lies in ``histogram``'s span of tracked buckets.
_IN_SPAN = 1 << 30
#: The span ``(first, last)`` bucket of no window.
_NO_SPAN = (np.int64(1), np.int64(0))
#: ``delta`` of a bucket that is not tracked (``windows.UNTRACKED``).
_UNTRACKED = np.iinfo(np.int64).min


@inline
def _row_slots(
    keys, r, scale, offset, mode, self_col, mask, label, col_ids, low, bucket_scale, n_buckets, span, slots, values
):
    """``slots[c]``: row r's pair with column c as an index of ``hist``/``wanted`` (its bucket, plus ``n_buckets``
    when positive; plus ``_IN_SPAN`` when the bucket lies in ``span``, ``(first, last)``), -1 when excluded;
    ``values[c]``: its distance (-0 made +0, so that equal values have one bit pattern). Written without a
    branch on the data, so that the loop vectorises; the callers read the slots in a second loop (a fused loop
    could not vectorise, and a table read per pair to find the tracked ones would cost more than the flag)."""
    row_mask = mask[min(np.int64(r), mask.shape[0] - 1)]
    first, last = span
    for c in range(keys.shape[1]):
        d = _distance(keys[r, c], scale, offset, mode)
        values[c] = d + np.float32(0.0)
        bucket = _bucket(d, low, bucket_scale, n_buckets)
        slot = bucket + n_buckets * np.int64(col_ids[c] == label)
        slot += _IN_SPAN * np.int64((bucket >= first) & (bucket <= last))
        slots[c] = np.int32(-1) if (c == self_col) | ~row_mask[c] else np.int32(slot)


_ordered_key = inline(ordered_key)


@pjit
def histogram(keys, form, col0, own, mask, row_ids, col_ids, weight, buckets, hist, span, delta, fine):
    """Add every eligible pair's bucket to ``hist`` ``(parts, 2 n_buckets)``: negatives, then positives, and its
    exact value to ``fine`` ``(parts, size)`` when its bucket is tracked: at ``delta[bucket - first] + 2 key +
    positive`` (``span``: the ``(first, last)`` tracked bucket, ``_NO_SPAN`` without windows; ``delta``: see
    ``windows.Windows``). The block's rows are cut into ``parts`` runs, one row of counts each, summed by
    the caller (integer sums: the result does not depend on threads). ``mask``: the block's eligibility, or one row of
    True for every row."""
    scale, offsets, mode = form
    low, bucket_scale = buckets
    n_parts, n_buckets = hist.shape[0], hist.shape[1] // 2
    n_rows, size = keys.shape[0], fine.shape[1]
    first = span[0]
    for t in prange(n_parts):
        slots = np.empty(keys.shape[1], dtype=np.int32)
        values = np.empty(keys.shape[1], dtype=np.float32)
        bits = values.view(np.int32)
        for r in range(n_rows * t // n_parts, n_rows * (t + 1) // n_parts):
            _row_slots(
                keys, r, scale, offsets[r], mode, own[r] - col0, mask, row_ids[r], col_ids, low, bucket_scale,
                n_buckets, span, slots, values,
            )  # fmt: skip
            for c in range(keys.shape[1]):
                s = slots[c]
                if s < 0:
                    continue
                if s >= _IN_SPAN:
                    s -= _IN_SPAN
                    positive = np.int64(s >= n_buckets)
                    at = delta[s - n_buckets * positive - first]
                    if at != _UNTRACKED:
                        at += 2 * _ordered_key(np.int64(bits[c])) + positive
                        if 0 <= at < size:  # else a value beyond its window: the caller's check sees it
                            fine[t, at] += weight
                hist[t, s] += weight


@inline
def _row_slots_alone(keys, form, col0, own, mask, row_ids, col_ids, buckets, n_buckets, r):
    """Row r's ``(slots, values)`` by ``_row_slots`` outside any window, in new arrays: the one start of
    ``count_wanted`` and ``list_wanted``, which must read a row's slots alike."""
    scale, offsets, mode = form
    low, bucket_scale = buckets
    slots = np.empty(keys.shape[1], dtype=np.int32)
    values = np.empty(keys.shape[1], dtype=np.float32)
    _row_slots(
        keys, r, scale, offsets[r], mode, own[r] - col0, mask, row_ids[r], col_ids, low, bucket_scale,
        n_buckets, _NO_SPAN, slots, values,
    )  # fmt: skip
    return slots, values


@pjit
def count_wanted(keys, form, col0, own, mask, row_ids, col_ids, buckets, wanted, counts):
    """Per row, the number of pairs whose (bucket, sign) is ``wanted`` (``(2 n_buckets,)``, as ``hist``)."""
    n_buckets = wanted.shape[0] // 2
    for r in prange(keys.shape[0]):
        slots, _ = _row_slots_alone(keys, form, col0, own, mask, row_ids, col_ids, buckets, n_buckets, r)
        found = 0
        for c in range(keys.shape[1]):
            found += int(slots[c] >= 0 and wanted[slots[c]])
        counts[r] = found


@pjit
def list_wanted(keys, form, col0, own, mask, row_ids, col_ids, buckets, wanted, offsets, out_d, out_p):
    """The distances and signs of the wanted pairs, row r's from ``offsets[r]`` (``count_wanted``'s counts)."""
    n_buckets = wanted.shape[0] // 2
    for r in prange(keys.shape[0]):
        if offsets[r + 1] == offsets[r]:
            continue
        slots, values = _row_slots_alone(keys, form, col0, own, mask, row_ids, col_ids, buckets, n_buckets, r)
        at = offsets[r]
        for c in range(keys.shape[1]):
            if slots[c] >= 0 and wanted[slots[c]]:
                out_d[at] = values[c]
                out_p[at] = slots[c] >= n_buckets
                at += 1
