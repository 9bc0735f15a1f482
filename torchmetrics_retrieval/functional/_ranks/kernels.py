"""The numba kernels of the full-ranking count (``functional._ranks.count``), compiled on first use and
cached on disk; parallel over rows on the threads ``buffer.kernel_threads`` sets.

Every query ``q`` carries ``filled[q]`` sorted thresholds, each as a bracket ``[lower, upper]`` of stage-1
keys: an item whose key lies below ``lower[q, j]`` by more than the query's rounding bound ``tol[q]`` is
certainly ranked before threshold ``j``; above ``upper[q, j]`` by more than it, certainly after. An eligible
item is counted in ``hist[q, b]``, ``b`` the number of thresholds it certainly follows, when it certainly
precedes the others; otherwise it is *ambiguous* and listed for an exact comparison. An item whose label id equals
its query's (``query_ids``, ``item_ids``; ids that never match when the caller does not skip) is skipped: it is
one of the query's relevant items, whose place among the thresholds (made from those very items) the caller
knows without comparing.

The per-query arrays travel as one tuple ``table = (lower, upper, filled, tol, lut, base, scale)``. ``lut``
is a lookup table over ``[base, last]`` (``last``: above it an item follows every threshold): bucket
``(key - base) * scale`` holds ``f``, how many thresholds every key of the bucket certainly follows, when every key
of the bucket also certainly precedes the next threshold (a *pure* bucket: its keys' bin is ``f`` with no more
work), and ``-1 - f`` when a threshold's bracket reaches into it.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

#: Helpers are inlined into the kernels (numba IR): a call passing arrays counts references on each of them.
inline = numba.njit(cache=True, nogil=True, inline="always")
pjit = numba.njit(cache=True, nogil=True, parallel=True)

_AMBIGUOUS = -1


@pjit
def build_table(lower, upper, filled, tol, lut, base, scale):
    """Fill ``lut``, ``base`` and ``scale`` of every query (see the module docstring)."""
    n_buckets = lut.shape[1]
    for q in prange(lower.shape[0]):
        n = filled[q]
        if n == 0:
            continue
        low = (lower[q, 0] if np.isfinite(lower[q, 0]) else upper[q, 0]) - tol[q]
        width = (upper[q, n - 1] + tol[q] - low) / n_buckets
        base[q] = low
        scale[q] = 1.0 / width if width > 0.0 and np.isfinite(1.0 / width) else 0.0  # 0: every key in bucket 0
        margin = width * 1e-3  # a key's bucket is computed in float64: allow for its rounding
        first = 0
        for b in range(n_buckets):
            while first < n and upper[q, first] + tol[q] < low + b * width - margin:
                first += 1
            if scale[q] == 0.0:  # one bucket holds every key: never pure
                lut[q, b] = -1 if b == 0 else 0
                continue
            # the last bucket also takes the keys rounded past the table's end: never pure
            pure = b < n_buckets - 1 and (first == n or lower[q, first] - tol[q] > low + (b + 1) * width + margin)
            lut[q, b] = first if pure else -1 - first


@inline
def _bin(lower, upper, filled, tol, lut, base, scale, q, key):
    # The bin of ``key``, or -1 when it is ambiguous. A pure bucket of the table gives the bin; another bucket a
    # lower bound of the number of thresholds the key certainly follows (0 below the table), and a short walk
    # the exact number: a bucket is narrower than the gap between most thresholds, so the walk rarely takes a
    # step (a binary search would take several, each a mispredicted branch or a dependent load).
    offset = key - base[q]
    first = 0
    if offset >= 0.0:
        entry = lut[q, min(np.int64(offset * scale[q]), lut.shape[1] - 1)]
        if entry >= 0:  # a pure bucket
            return entry
        first = -1 - entry
    n = filled[q]
    below = key - tol[q]
    while first < n and upper[q, first] < below:
        first += 1
    return first if first == n or lower[q, first] > key + tol[q] else _AMBIGUOUS


@inline
def _last(upper, filled, tol, q):
    # Above this key an item follows every threshold of query q (-inf: q has none).
    n = filled[q]
    return upper[q, n - 1] + tol[q] if n > 0 else -np.inf


@inline
def _row(
    keys, r, col0, own, mask, has_mask, query_ids, item_ids, lower, upper, filled, tol, lut, base, scale, hist,
    out_cols, counting,
):  # fmt: skip
    # Row r of a block. ``counting``: add the certain items to ``hist`` and write the first ambiguous ones (as
    # many as ``out_cols`` holds); otherwise write every ambiguous one. Returns the number of ambiguous items.
    # The table's arrays come unpacked by the caller, once per block: unpacked here, once per row, they cost
    # more than the listing below saves.
    last = _last(upper, filled, tol, r)
    # First the columns that may precede a threshold (a fifth of them on clustered data), listed without a
    # branch: whether a key lies past the last threshold is unpredictable, and a branch on it per key costs
    # more than the list.
    near = np.empty(keys.shape[1], np.int32)
    n_near = 0
    for c in range(keys.shape[1]):
        near[n_near] = c
        n_near += np.float64(keys[r, c]) <= last
    capacity = out_cols.shape[0]
    ambiguous = 0
    own_col, query_id = own[r] - col0, query_ids[r]
    for i in range(n_near):
        c = near[i]
        if c == own_col or query_id == item_ids[c] or (has_mask and not mask[r, c]):
            continue
        found = _bin(lower, upper, filled, tol, lut, base, scale, r, np.float64(keys[r, c]))
        if found != _AMBIGUOUS:
            if counting:
                hist[r, found] += 1
            continue
        if ambiguous < capacity:
            out_cols[ambiguous] = col0 + c
        ambiguous += 1
    return ambiguous


@pjit
def count_rows(keys, col0, own, mask, has_mask, query_ids, item_ids, table, hist, n_ambiguous, out_cols):
    """Add the block's certain items to ``hist``; per row, the number of ambiguous items to ``n_ambiguous``
    and the gallery positions of the first ``out_cols.shape[1]`` of them to ``out_cols``."""
    lower, upper, filled, tol, lut, base, scale = table  # once: unpacking arrays counts references
    for r in prange(keys.shape[0]):
        n_ambiguous[r] = _row(
            keys, r, col0, own, mask, has_mask, query_ids, item_ids, lower, upper, filled, tol, lut, base, scale,
            hist, out_cols[r], True,
        )  # fmt: skip


@pjit
def list_ambiguous(keys, col0, own, mask, has_mask, query_ids, item_ids, table, rows, offsets, out_cols):
    """Every ambiguous item of the block rows ``rows``, row ``rows[i]``'s from ``offsets[i]`` to ``offsets[i + 1]``
    (for the rows whose items did not fit ``count_rows``'s buffers)."""
    unused = np.zeros((1, 1), dtype=np.int64)
    lower, upper, filled, tol, lut, base, scale = table
    for i in prange(rows.shape[0]):
        out = out_cols[offsets[i] : offsets[i + 1]]
        _row(
            keys, rows[i], col0, own, mask, has_mask, query_ids, item_ids, lower, upper, filled, tol, lut, base,
            scale, unused, out, False,
        )  # fmt: skip


@pjit
def count_preceding(distances, positions, filled, pair_rows, pair_distances, pair_positions, out):
    """For every listed item: how many thresholds of its row precede it or are it, by (distance, position)
    (``distances``, ``pair_distances``: float64 values of the reported distances)."""
    for i in prange(pair_rows.shape[0]):
        q, d, p = pair_rows[i], pair_distances[i], pair_positions[i]
        low, high = 0, filled[q]
        while low < high:
            mid = (low + high) >> 1
            if distances[q, mid] < d or (distances[q, mid] == d and positions[q, mid] <= p):
                low = mid + 1
            else:
                high = mid
        out[i] = low
