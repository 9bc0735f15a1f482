"""The numba kernels of the compiled stage-2 ordering (``compiled.order``), parallel over rows, compiled on first use
and cached on disk (module-level functions only: see ``kernels``)."""

from __future__ import annotations

import numpy as np
from numba import prange

from torchmetrics_retrieval.functional._search.compiled.kernels import decode, encode, jit, pjit, radix_sort


@pjit
def sort_rows(key_bits, items, gap, near_limit, sorted_keys, sorted_items, near, n_threads):
    n_rows = key_bits.shape[0]
    for t in prange(n_threads):
        r0, r1 = n_rows * t // n_threads, n_rows * (t + 1) // n_threads
        sort_rows_range(key_bits, items, gap, near_limit, sorted_keys, sorted_items, near, r0, r1)


@jit
def sort_rows_range(key_bits, items, gap, near_limit, sorted_keys, sorted_items, near, r0, r1):
    n = key_bits.shape[1]
    codes, scratch, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(256, np.int64)
    for r in range(r0, r1):
        in_order = True
        for j in range(n):
            codes[j] = encode(key_bits[r, j], items[r, j])
            in_order &= j == 0 or codes[j] >= codes[j - 1]
        if not in_order:  # (the compiled buffer returns its rows sorted)
            radix_sort(codes, scratch, counts)
        for j in range(n):
            sorted_keys[r, j], sorted_items[r, j] = decode(codes[j])
        keys = sorted_keys[r].view(np.float32)
        for j in range(n):
            if keys[j] <= near_limit[r]:
                near[r, j] = True
            if j and np.float64(keys[j]) - np.float64(keys[j - 1]) <= gap[r]:
                near[r, j] = near[r, j - 1] = True


@pjit
def sort_runs(values, items, near, order, n_threads):
    n_rows = values.shape[0]
    for t in prange(n_threads):
        sort_runs_range(values, items, near, order, n_rows * t // n_threads, n_rows * (t + 1) // n_threads)


@jit
def sort_runs_range(values, items, near, order, r0, r1):
    n = values.shape[1]
    for r in range(r0, r1):
        for j in range(n):
            order[r, j] = j
        j = 0
        while j < n:
            if not near[r, j]:
                j += 1
                continue
            start = j
            while j < n and near[r, j]:
                j += 1
            for a in range(start + 1, j):  # insertion sort of the run by (value, item)
                moving = order[r, a]
                b = a
                while b > start and (
                    values[r, moving] < values[r, order[r, b - 1]]
                    or (
                        values[r, moving] == values[r, order[r, b - 1]] and items[r, moving] < items[r, order[r, b - 1]]
                    )
                ):
                    order[r, b] = order[r, b - 1]
                    b -= 1
                order[r, b] = moving


@pjit
def clear_uniform_runs(near, relevant, n_threads):
    n_rows = near.shape[0]
    for t in prange(n_threads):
        clear_uniform_runs_range(near, relevant, n_rows * t // n_threads, n_rows * (t + 1) // n_threads)


@jit
def clear_uniform_runs_range(near, relevant, r0, r1):
    n = near.shape[1]
    for r in range(r0, r1):
        j = 0
        while j < n:
            if not near[r, j]:
                j += 1
                continue
            start, found = j, 0
            while j < n and near[r, j]:
                found += relevant[r, j]
                j += 1
            if found == 0 or found == j - start:
                near[r, start:j] = False


@jit
def key_distance(key, query_sq, mode):
    # The distance a float32 key stands for, in float64 (``certify._key_to_distance``): mode 0 dot, 1 cosine,
    # 2 squared L2, 3 L2 (the hardware square root, correctly rounded).
    value = np.float64(key)
    if mode == 0:
        return value
    if mode == 1:
        return 1.0 + value
    squared = value + query_sq
    if mode == 2:
        return squared
    return np.sqrt(max(squared, 0.0))


@pjit
def ranked_columns(keys, items, near, values, order, query_sq, mode, distances, chosen, valid, recomputed, n_threads):
    n_rows = keys.shape[0]
    for t in prange(n_threads):
        r0, r1 = n_rows * t // n_threads, n_rows * (t + 1) // n_threads
        ranked_columns_range(
            keys, items, near, values, order, query_sq, mode, distances, chosen, valid, recomputed, r0, r1
        )


@jit
def ranked_columns_range(
    keys, items, near, values, order, query_sq, mode, distances, chosen, valid, recomputed, r0, r1
):
    # The first columns of each row in the order ``order``: the recomputed value of a near entry, else the distance
    # of its key; an empty slot (key +inf) is invalid, at distance +inf, item 0.
    for r in range(r0, r1):
        for j in range(distances.shape[1]):
            source = order[r, j]
            key = keys[r, source]
            valid[r, j] = key < np.inf
            recomputed[r, j] = valid[r, j] and near[r, source]
            if not valid[r, j]:
                distances[r, j], chosen[r, j] = np.inf, 0
            else:
                chosen[r, j] = items[r, source]
                distances[r, j] = values[r, source] if recomputed[r, j] else key_distance(key, query_sq[r], mode)


@pjit
def merge_rows(first, second, merged, n_threads):
    n_rows = merged[0].shape[0]
    for t in prange(n_threads):
        merge_rows_range(first, second, merged, n_rows * t // n_threads, n_rows * (t + 1) // n_threads)


@jit
def merge_rows_range(first, second, merged, r0, r1):
    (d1, i1, v1), (d2, i2, v2), (out_d, out_i, out_v) = first, second, merged
    n1, n2, k, empty = d1.shape[1], d2.shape[1], out_d.shape[1], np.int64(2**31 - 1)
    for r in range(r0, r1):
        a = b = 0
        for j in range(k):
            # an empty slot, or the end of a list, sorts as (+inf, 2**31 - 1): last
            take_first = a < n1 and v1[r, a]
            take_second = b < n2 and v2[r, b]
            if take_first and take_second:
                take_first = d1[r, a] < d2[r, b] or (d1[r, a] == d2[r, b] and i1[r, a] < i2[r, b])
            if take_first:
                out_d[r, j], out_i[r, j], out_v[r, j] = d1[r, a], i1[r, a], True
                a += 1
            elif take_second:
                out_d[r, j], out_i[r, j], out_v[r, j] = d2[r, b], i2[r, b], True
                b += 1
            else:
                out_d[r, j], out_i[r, j], out_v[r, j] = np.inf, empty, False
